"""The supervisor's building blocks without a server: watchdog, process group, state file, timeouts."""
from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from vllm_omni_launcher.server import registry
from vllm_omni_launcher.server.process import launch_prep, process_group, timeouts
from vllm_omni_launcher.server.storage import state_file
from vllm_omni_launcher.server.supervision import adoption
from vllm_omni_launcher.server.config.local_config import LocalConfig
from vllm_omni_launcher.server.launch.spec import LaunchSpec, MemoryConfig
from vllm_omni_launcher.server.process.server_run import ServerRun
from vllm_omni_launcher.server.supervision.supervisor import Supervisor

# A "server" that ignores polite signals and has a child: only SIGKILL of the group ends both.
STUBBORN = textwrap.dedent("""
    import signal, subprocess, sys, time
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    child = subprocess.Popen([sys.executable, "-c", "import signal,time\\n"
                              "signal.signal(signal.SIGTERM, signal.SIG_IGN)\\nwhile True: time.sleep(1)"])
    print("ready", child.pid, flush=True)
    while True:
        time.sleep(1)
""")

OWNER = textwrap.dedent("""
    import json, os, sys, time
    from vllm_omni_launcher.server.process import process_group
    log = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    proc = process_group.spawn([sys.executable, "-c", "import time\\nwhile True: time.sleep(1)"], dict(os.environ), log)
    process_group.find_server_child(proc)
    print(json.dumps({"pgid": proc.pgid, "server": proc.server_pid}), flush=True)
    time.sleep(600)
""")


def _wait_gone(pgid: int, seconds: float = 15.0) -> list[int]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        left = [p.pid for p in process_group.group_members(pgid)]
        if not left:
            return []
        time.sleep(0.05)
    return left


def test_stop_escalates_to_sigkill_for_the_whole_group(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    proc = process_group.spawn([sys.executable, "-c", STUBBORN], dict(os.environ), fd)
    os.close(fd)
    process_group.find_server_child(proc)
    deadline = time.monotonic() + 20
    while "ready" not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    child = int(log.read_text().split("ready")[1].split()[0])
    members = {p.pid for p in process_group.group_members(proc.pgid)}
    assert {proc.pgid, proc.server_pid, child} <= members
    assert proc.alive()
    left = proc.stop(timeout=2.0)
    assert left == []
    assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE
    assert proc.poll() is not None


def test_watchdog_stops_the_group_when_the_owner_is_sigkilled(tmp_path: Path) -> None:
    owner = subprocess.Popen([sys.executable, "-c", OWNER, str(tmp_path / "log")], stdout=subprocess.PIPE, text=True)
    info = json.loads(owner.stdout.readline())
    assert process_group.group_members(info["pgid"])
    owner.kill()
    owner.wait()
    assert _wait_gone(info["pgid"]) == []
    assert "owner process" in (tmp_path / "log").read_text()


def test_watchdog_reports_the_server_exit_code(tmp_path: Path) -> None:
    fd = os.open(tmp_path / "log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    proc = process_group.spawn([sys.executable, "-c", "import sys; sys.exit(7)"], dict(os.environ), fd)
    os.close(fd)
    assert proc.popen is not None and proc.popen.wait(timeout=20) == 7
    missing = process_group.spawn(["/nonexistent/vllm"], dict(os.environ), os.open(os.devnull, os.O_WRONLY))
    assert missing.popen is not None and missing.popen.wait(timeout=20) == 127


def test_watchdog_falls_back_to_the_launchers_grace_when_none_is_passed() -> None:
    # the script runs by path and cannot import timeouts, so it repeats the value; they must agree
    from vllm_omni_launcher.server.process import watchdog  # noqa: PLC0415

    assert watchdog.GRACE_S == timeouts.WATCHDOG_GRACE_S


LEADER = textwrap.dedent("""
    import subprocess, sys, time
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    print(child.pid, flush=True)
    time.sleep(120)
""")


def test_owns_group_refuses_a_reused_leader_pid() -> None:
    """The test makes the group it reasons about: a leader (new session) with a child."""
    leader = subprocess.Popen([sys.executable, "-c", LEADER], start_new_session=True, stdout=subprocess.PIPE,
                              text=True)
    child = int(leader.stdout.readline())
    try:
        created = process_group.create_time(leader.pid)
        assert created is not None
        assert process_group.owns_group(leader.pid, created), "our live leader"
        # pid == pgid is alive but started at another time: a stranger reusing the id
        assert not process_group.owns_group(leader.pid, created - 1000)
        assert not process_group.owns_group(leader.pid, created + 1000)
        # the leader dies, its child keeps the group (and so the id) alive: still ours, and stoppable
        leader.kill()
        leader.wait()
        assert process_group.create_time(leader.pid) is None
        assert process_group.owns_group(leader.pid, created)
        assert [p.pid for p in process_group.group_members(leader.pid)] == [child]
        group = process_group.ServerProcess(pgid=leader.pid, leader_create_time=created)
        assert group.stop(timeout=2.0, graceful=False) == []
        assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE
        # an empty group of a dead leader: nothing to signal, nothing reported left
        assert group.members() == [] and group.stop(timeout=1.0) == []
    finally:
        for pid in (leader.pid, child):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        leader.wait()


def _state(pgid: int = 4242, key: str = "sekret-key") -> state_file.ServerState:
    return state_file.ServerState(pgid=pgid, leader_create_time=1.0, server_pid=pgid + 1, server_create_time=2.0,
                                  argv=["vllm", "serve", "m"], host="127.0.0.1", port=9000, fingerprint="f",
                                  requested_fingerprint="f", spec={"model": "m"}, api_key=key)


def test_state_file_is_private_and_roundtrips(tmp_path: Path) -> None:
    data = str(tmp_path / "data")
    path = state_file.write(data, _state())
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    [(found, st)] = state_file.read_all(data)
    assert found == path and st is not None and st.api_key == "sekret-key" and st.port == 9000
    assert "sekret" not in repr(st)
    os.chmod(path, 0o644)                      # readable by others: not ours, never trusted
    assert state_file.read(path) is None
    state_file.remove(data, 4242)
    assert state_file.read_all(data) == []


def test_unverifiable_state_is_dropped_without_signalling(tmp_path: Path) -> None:
    """A state file naming a live process that is not our server: forget it, signal nothing."""
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        st = _state(pgid=victim.pid)
        st.server_pid, st.server_create_time = victim.pid, process_group.create_time(victim.pid)
        st.argv = ["vllm", "serve", "something-else"]          # cmdline does not match
        st.owner_pid, st.owner_create_time = 1, 0.0             # "owner" is long gone
        data = str(tmp_path / "data")
        state_file.write(data, st)
        config = LocalConfig(data_dir=data)
        assert adoption.sweep_left_behind(config, LaunchSpec(model="Wan-AI/Wan2.2-TI2V-5B-Diffusers"), set(),
                                          None, None) is None
        assert victim.poll() is None, "a process that is not verifiably ours must never be signalled"
        assert state_file.read_all(data) == []
    finally:
        victim.kill()
        victim.wait()


def test_gpu_overlap_rules() -> None:
    assert registry.gpus_overlap(None, (1,))
    assert registry.gpus_overlap((0, 1), (1,))
    assert not registry.gpus_overlap((0,), (1,))


def test_startup_timeout_scales_with_model_and_download(tmp_path: Path) -> None:
    cache = {"HF_HOME": str(tmp_path / "hf")}
    a14b = LaunchSpec(model="Wan-AI/Wan2.2-T2V-A14B-Diffusers")
    ti2v = LaunchSpec(model="Wan-AI/Wan2.2-TI2V-5B-Diffusers")
    assert timeouts.startup_timeout(a14b, cache) > timeouts.startup_timeout(ti2v, cache)
    downloaded = tmp_path / "hf" / "hub" / "models--Wan-AI--Wan2.2-TI2V-5B-Diffusers" / "snapshots" / "abc"
    downloaded.mkdir(parents=True)
    assert timeouts.startup_timeout(ti2v, cache) < timeouts.startup_timeout(
        LaunchSpec(model="Wan-AI/Wan2.2-TI2V-5B-Diffusers", memory=MemoryConfig(offload="layerwise")), {})
    assert timeouts.startup_timeout(ti2v, cache) == timeouts.LOAD_BASE_S[1]
    assert timeouts.startup_budget(ti2v, cache, None, 42.0) == 42.0, "the local config's value"
    assert timeouts.startup_budget(ti2v, cache, 7.0, 42.0) == 7.0, "the caller's timeout wins"
    assert timeouts.startup_budget(ti2v, cache, None, None) == timeouts.LOAD_BASE_S[1]


def test_repr_and_status_hold_no_secret(tmp_path: Path) -> None:
    spec = LaunchSpec(model="Wan-AI/Wan2.2-TI2V-5B-Diffusers")
    sup = Supervisor(spec, LocalConfig(data_dir=str(tmp_path)), api_key="very-secret-key")
    assert "very-secret" not in repr(sup) and "very-secret" not in repr(sup.status())
    assert sup.status().phase == "stopped" and not sup.alive() and sup.progress() is None
    launch = launch_prep.prepare(spec, LocalConfig(data_dir=str(tmp_path)), ["vllm"], str(tmp_path),
                                 "very-secret-key", None, lambda: False)
    assert launch.api_key == "very-secret-key" and launch.env["VLLM_API_KEY"] == "very-secret-key"
    assert "very-secret" not in repr(launch) and "very-secret" not in " ".join(launch.command.argv)
    run = ServerRun(spec, process_group.ServerProcess(pgid=os.getpid(), leader_create_time=None), launch.port,
                    launch.api_key, str(tmp_path / "x.log"), launch.command.argv, str(launch.storage), None,
                    str(tmp_path))
    assert "very-secret" not in repr(run) and run.redact(["key=very-secret-key"]) == ["key=***"]


@pytest.mark.parametrize("sig", [signal.SIGTERM])
def test_exit_handler_chains_to_the_previous_handler(sig: int) -> None:
    code = textwrap.dedent(f"""
        import signal, sys, os
        seen = []
        signal.signal({int(sig)}, lambda s, f: (seen.append(s), print("previous handler ran", flush=True)))
        from vllm_omni_launcher.server import registry
        assert registry.install_exit_handlers()
        os.kill(os.getpid(), {int(sig)})
        print("after", seen, flush=True)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "previous handler ran" in out.stdout and f"after [{int(sig)}]" in out.stdout, out.stderr
