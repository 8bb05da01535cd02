"""The supervisor against the stub server: real `vllm serve --omni` code, fake GPU.

Each case checks what the user sees (status text, error text and its `kind`) and that no
process is left (every `STUB_PID=` the stub printed, and every process group, is gone).
Waits are bounded polls, never timing assertions; speed is measured in bench/.

A stub start costs tens of seconds (it imports the real vLLM and vLLM-Omni), so related
cases share one server's life where they do not interfere: e.g. slow load, a job with
progress, a hard cancel, a crash after ready and the job after it run as one chain.
Knobs: VLLM_OMNI_STUB_* (see stub_vllm_serve.py), passed through LocalConfig.extra_env.
"""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import stat
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any, Callable, Optional

import psutil
import pytest

import stubserver
from processes import alive, assert_no_process_left, stub_pids
from stubserver import wait_for
from supervised_jobs import auth, job_state, session, submit, wait_job

from vllm_omni_launcher.server import registry
from vllm_omni_launcher.server.logs import failures
from vllm_omni_launcher.server.process import process_group
from vllm_omni_launcher.server.storage import state_file
from vllm_omni_launcher.server.supervision.cancel_policy import RESTART, CancelPolicy
from vllm_omni_launcher.server.logs.failures import ServerFailure
from vllm_omni_launcher.server.config.local_config import LocalConfig
from vllm_omni_launcher.server.launch.spec import LaunchSpec, RuntimeConfig
from vllm_omni_launcher.server.registry import Status

TI2V = "Wan-AI/Wan2.2-TI2V-5B-Diffusers"
START_S = 420.0          # bound for one stub start (it imports vLLM on a small CI box)
REPO = Path(__file__).resolve().parents[2]


# ---- helpers -------------------------------------------------------------------------------
def make_config(data_dir: Path, *, hang_timeout_s: float = 120.0, port: Optional[int] = None,
                **knobs: Any) -> LocalConfig:
    return LocalConfig(server_command=(stubserver.server_python(), str(stubserver.STUB_SCRIPT)),
                       data_dir=str(data_dir), port=port, hang_timeout_s=hang_timeout_s, startup_timeout_s=START_S,
                       extra_env={f"VLLM_OMNI_STUB_{k.upper()}": str(v) for k, v in knobs.items()})


def spec_for(gpus: Optional[tuple[int, ...]] = (0,), **changes: Any) -> LaunchSpec:
    return LaunchSpec(model=TI2V, gpus=gpus, **changes)


def phases_of(statuses: list[Status]) -> list[str]:
    out: list[str] = []
    for s in statuses:
        if not out or out[-1] != s.phase:
            out.append(s.phase)
    return out


# ---- one server's life: slow load, progress, hard cancel, crash after ready (up to its restart) --
def test_slow_load_progress_hard_cancel_and_crash_restart(data_dir: Path) -> None:
    statuses: list[Status] = []
    config = make_config(data_dir, load_delay_s=2, step_s=0.05, crash_after_jobs=2)
    spec = spec_for()
    sup = registry.get_or_start(spec, config, on_status=statuses.append)

    # -- startup phases, in order, as the user sees them
    phases = phases_of(statuses)
    order = ["starting", "downloading", "loading", "warmup", "ready"]
    assert phases[0] == "starting" and phases[-1] == "ready" and {"loading", "warmup"} <= set(phases)
    assert phases == sorted(phases, key=order.index), phases
    assert any("Model loaded" in s.text for s in statuses)
    status = sup.status()
    assert status.ready and status.generation == 1 and status.url == sup.url and status.last_error is None
    assert status.text.startswith("Ready") and sup.url in status.text

    # -- the key lives only in the child's environment
    key = sup.api_key
    assert key and len(key) >= 32
    server = psutil.Process(status.pid)
    assert key not in " ".join(server.cmdline())
    env = server.environ()
    assert env["VLLM_API_KEY"] == key
    assert env["VLLM_OMNI_SERVER_STORAGE__PATH"].startswith(str(data_dir))
    assert key not in repr(sup) and key not in repr(status) and key not in " ".join(s.text for s in statuses)
    assert key not in Path(status.log_path).read_text(errors="replace")
    http = session()
    assert http.get(f"{sup.url}/v1/models", timeout=10).status_code == 401
    models = http.get(f"{sup.url}/v1/models", headers=auth(sup), timeout=10).json()
    assert [m["id"] for m in models["data"]] == [spec.served_name]
    # the server tree is its own process group, not ComfyUI's
    assert os.getpgid(status.pid) == sup.pgid != os.getpgid(0)
    assert stat.S_IMODE(next((data_dir / "state").glob("server-*.json")).stat().st_mode) == 0o600

    # -- a job shows real denoise progress (the warm-up run does not count)
    seen: list[tuple[int, int, int]] = []
    job = submit(sup, steps=8)
    while job_state(sup, job)["status"] not in ("completed", "failed"):
        p = sup.progress()
        if p is not None:
            seen.append((p.run_id, p.step, p.total))
        time.sleep(0.05)
    assert job_state(sup, job)["status"] == "completed"
    final = sup.progress()
    assert final is not None and final.run_id == 1 and final.done and final.total == 8 and final.eta_s == 0
    assert {r for r, _, _ in seen} <= {1} and all(t == 8 for _, _, t in seen)

    # -- cancel that restarts: DELETE cannot stop a running Wan denoise; with a policy that weighs any
    #    denoise left above a restart, the server is restarted once the grace is over
    port, first_pid = status.port, status.pid
    long_job = submit(sup, steps=200)
    wait_for(lambda: (p := sup.progress()) is not None and p.run_id == 2 and p.step >= 2, 120, "the long job to run")
    deleted = http.delete(f"{sup.url}/v1/videos/{long_job}", headers=auth(sup), timeout=30)
    assert deleted.status_code == 200, deleted.text
    sup.cancel_policy = CancelPolicy(grace_s=1.0, ratio=0.0, slack_s=0.0)
    assert sup.cancel_job(long_job, run_floor=1).action == RESTART
    wait_for(lambda: long_job in (sup.status().restart_reason or ""), 60, "the restart for the cancelled job")
    reason = sup.status().restart_reason
    assert "still running on the GPU" in reason and "restarting the server" in reason
    assert sup.wait_ready(START_S)
    status = sup.status()
    assert status.generation == 2 and status.port == port and status.ready
    assert not alive(first_pid)
    assert sup.progress().aborted and sup.progress().run_id == 2
    # the relaunch is ready a moment before the restart is counted (Recovery._relaunch)
    wait_for(lambda: sup.status().restarts == 1, 30, "the hard-cancel restart to be counted")

    # -- crash after ready (the stub's engine dies after its 2nd job): the restart begins.  Its relaunch
    #    is not waited for (a vLLM import): a crash's relaunch is Recovery._restart_after(.., "crash") ->
    #    _relaunch, the path the hang restart below (test_oom_in_job_keeps_the_server_and_a_hang_restarts_it)
    #    proves ready, counted, "Restarted after: ..." and serving jobs.
    for seed in (1, 2):
        assert wait_job(sup, submit(sup, seed=seed))["status"] == "completed"
    crashed_pid = sup.status().pid
    wait_for(lambda: (s := sup.status()).generation == 3 and s.pid != crashed_pid, START_S,
             "the restart after the crash to start a new server")
    status = sup.status()
    assert status.last_error_kind == failures.CRASH and "exited after it was ready" in status.last_error
    assert "exited after it was ready" in status.restart_reason and not alive(crashed_pid)

    pgid = sup.pgid
    registry.stop(spec.fingerprint())
    assert sup.status().phase == "stopped" and registry.find(spec.fingerprint()) is None
    assert_no_process_left(data_dir, (pgid,))
    assert list((data_dir / "state").glob("*.json")) == []


# ---- OOM during a job (server survives), then a hung server (restarted) ----------------------
def test_oom_in_job_keeps_the_server_and_a_hang_restarts_it(data_dir: Path) -> None:
    # 8 s of failed /health before "hung": a healthy stub on a busy 2-core box must not miss that long
    config = make_config(data_dir, hang_timeout_s=8.0, oom_in_job=1, hang_after_jobs=1, step_s=0.02)
    sup = registry.get_or_start(spec_for(), config)
    first = sup.status()

    failed = wait_job(sup, submit(sup, steps=6))
    assert failed["status"] == "failed"
    message = json.dumps(failed.get("error"))
    explained = failures.explain_job_error(message)
    assert explained is not None and explained.kind == failures.OOM_JOB and "VAE tiling" in str(explained)
    wait_for(lambda: sup.status().last_error_kind == failures.OOM_JOB, 30, "the OOM to show on the status")
    status = sup.status()
    assert "during a job" in status.last_error and "ran out of GPU memory" in status.text
    assert status.ready and status.generation == 1 and status.pid == first.pid and alive(first.pid)
    assert sup.progress().aborted

    # the next job works on the same server; then the stub's HTTP loop wedges (SIGTERM ignored)
    assert wait_job(sup, submit(sup, steps=4, seed=2))["status"] == "completed"
    wait_for(lambda: sup.status().last_error_kind == failures.HUNG, 60, "the hang to be noticed")
    wait_for(lambda: (s := sup.status()).generation == 2 and s.ready and s.restarts == 1, START_S,
             "the restart after the hang")
    status = sup.status()
    assert "stopped answering /health" in status.last_error and status.restarts == 1
    assert status.text.startswith("Restarted after: stopped answering"), status.text
    assert not alive(first.pid)
    # the knobs apply per server process: its first job runs out of memory again, the next works
    assert wait_job(sup, submit(sup, steps=2, seed=3))["status"] == "failed"
    assert wait_job(sup, submit(sup, steps=2, seed=4))["status"] == "completed"
    pgid = sup.pgid
    registry.stop_all()
    assert_no_process_left(data_dir, (pgid,))


# ---- OOM while loading (explained, never retried) and the OOM fallback (the leaner spec tried once,
#      noted): test_nodes_stub.py::test_auto_fallback_off_stops_with_the_plan_and_the_fix and
#      ::test_auto_serving_falls_back_down_the_planner_ladder_on_oom drive the same
#      registry.get_or_start -> Starter.start (supervision/starting.py) through the Local Server node.


# ---- cancel while the real server loads its weights: LaunchCancelled, nothing left ----------
def test_cancel_while_loading_stops_everything_within_2s(data_dir: Path) -> None:
    statuses: list[Status] = []
    cancel_at: list[float] = []

    def should_cancel() -> bool:
        if not cancel_at and any(s.phase == "loading" and s.progress for s in statuses):
            cancel_at.append(time.monotonic())
        return bool(cancel_at)

    with pytest.raises(registry.LaunchCancelled) as caught:
        registry.get_or_start(spec_for(), make_config(data_dir, load_delay_s=300), on_status=statuses.append,
                              should_cancel=should_cancel)
    took = time.monotonic() - cancel_at[0]
    assert took < 3.0, f"the cancel took {took:.1f} s (the issue allows 2 s)"
    assert caught.value.kind == failures.CANCELLED
    pids = stub_pids(data_dir)
    assert pids and not [p for p in pids if alive(p)], "checked at once: no process outlived the cancel"
    assert registry.all_servers() == [] and list((data_dir / "state").glob("*.json")) == []
    shards = [s.progress for s in statuses if s.phase == "loading" and s.progress]
    assert shards and shards[-1][2] == "shards" and shards[-1][0] == shards[-1][1], shards
    assert statuses[-1].phase == "stopped" and all(a != b for a, b in zip(statuses, statuses[1:]))


# ---- a configured port that is taken: clear error, nothing launched -------------------------
def test_configured_port_in_use(data_dir: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ServerFailure) as caught:
            registry.get_or_start(spec_for(), make_config(data_dir, port=port))
    err = caught.value
    assert err.kind == failures.PORT_IN_USE and err.setting == "port" and str(port) in err.what
    assert "VLLM_OMNI_LAUNCHER_PORT" in err.fix
    assert stub_pids(data_dir) == [] and registry.all_servers() == []


# ---- keep-alive expiry, restart on next use, and spec changes on overlapping GPUs -----------
def test_keep_alive_then_spec_changes_stop_overlapping_servers(data_dir: Path) -> None:
    events: list[tuple[str, Status]] = []
    lock = threading.Lock()

    def recorder(name: str) -> Callable[[Status], None]:
        def on_status(status: Status) -> None:
            with lock:
                events.append((name, status))
        return on_status

    config = make_config(data_dir)
    a = spec_for((0,))
    sup_a = registry.get_or_start(a, config, on_status=recorder("a"), keep_alive_minutes=0.02)
    a_pid = sup_a.status().pid
    wait_for(lambda: sup_a.status().phase == "stopped", 120, "the keep-alive to stop the idle server")
    assert "idle" in sup_a.status().text and "next job starts it again" in sup_a.status().text
    assert not sup_a.alive() and not alive(a_pid)
    assert registry.find(a.fingerprint()) is sup_a

    # next use restarts it (same supervisor, next generation); keep-alive off from now on
    assert registry.get_or_start(a, config, keep_alive_minutes=0) is sup_a
    assert sup_a.ready() and sup_a.generation == 2

    # a different spec on another GPU leaves it alone
    b = spec_for((1,), runtime=RuntimeConfig(enforce_eager=True))
    sup_b = registry.get_or_start(b, config, on_status=recorder("b"))
    assert sup_a.ready() and sup_b.ready() and len(registry.all_servers()) == 2

    # a spec on every GPU overlaps both: they stop before it starts.  Its start is cancelled as soon
    # as it begins (its readiness would be one more vLLM import; a server on all GPUs becoming ready is
    # test_nodes_stub.py's module server, gpus "all"); the data_dir fixture then checks that no process
    # of the three is left.
    c = spec_for(None, runtime=RuntimeConfig(enforce_eager=True))
    old_pids = (sup_a.status().pid, sup_b.status().pid)

    def c_started() -> bool:
        with lock:
            return any(name == "c" and s.phase == "starting" for name, s in events)

    with pytest.raises(registry.LaunchCancelled):
        registry.get_or_start(c, config, on_status=recorder("c"), should_cancel=c_started)
    assert registry.all_servers() == []
    assert sup_a.status().phase == "stopped" and sup_b.status().phase == "stopped"
    assert not any(alive(p) for p in old_pids)
    with lock:
        order = [(name, s.phase) for name, s in events]
    first_c = order.index(("c", "starting"))
    assert order.index(("a", "stopped"), order.index(("a", "ready"))) < first_c
    assert order.index(("b", "stopped")) < first_c


# ---- the owner is SIGKILLed: the server does not outlive it ---------------------------------
OWNER = textwrap.dedent("""
    import json, os, sys, threading
    sys.path.insert(0, sys.argv[2])
    import stubserver
    from vllm_omni_launcher.server.config.local_config import LocalConfig
    from vllm_omni_launcher.server.launch.spec import LaunchSpec
    from vllm_omni_launcher.server.supervision.supervisor import Supervisor
    config = LocalConfig(server_command=(stubserver.server_python(), str(stubserver.STUB_SCRIPT)),
                         data_dir=sys.argv[1], gpu_lock_dir=os.environ["VLLM_OMNI_LAUNCHER_GPU_LOCK_DIR"],
                         startup_timeout_s=600)
    sups = [Supervisor(LaunchSpec(model="Wan-AI/Wan2.2-TI2V-5B-Diffusers", gpus=(g,)), config)
            for g in range(int(sys.argv[3]))]
    threads = [threading.Thread(target=s.start) for s in sups]
    [t.start() for t in threads]
    [t.join() for t in threads]
    print(json.dumps([{"pgid": s.pgid, "pid": s.status().pid, "url": s.url, "fp": s.spec.fingerprint()}
                      for s in sups]), flush=True)
    threading.Event().wait()
""")


def start_owner(data_dir: Path, servers: int) -> tuple[subprocess.Popen, list[dict[str, Any]]]:
    owner = subprocess.Popen([sys.executable, "-c", OWNER, str(data_dir), str(Path(stubserver.__file__).parent),
                              str(servers)], stdout=subprocess.PIPE, text=True)
    line = owner.stdout.readline()
    assert line, "the owner process did not start its servers"
    return owner, json.loads(line)


def test_server_dies_with_its_sigkilled_owner(data_dir: Path) -> None:
    owner, [info] = start_owner(data_dir, 1)
    assert alive(info["pid"]) and process_group.group_members(info["pgid"])
    owner.kill()                  # SIGKILL: no atexit, no signal handler runs
    owner.wait()
    assert_no_process_left(data_dir, (info["pgid"],))
    assert "owner process" in next((data_dir / "logs").glob("*.log")).read_text(errors="replace")


# ---- a server left behind: adopt it if it is ours, healthy and wanted; else stop it ---------
def test_left_behind_servers_are_adopted_or_stopped(data_dir: Path) -> None:
    owner, (x, y) = start_owner(data_dir, 2)
    for leader in (x["pgid"], y["pgid"]):       # their watchdogs die first, then the owner
        os.kill(leader, signal.SIGKILL)
    owner.kill()
    owner.wait()
    time.sleep(1.0)                             # give a (wrongly) surviving watchdog time to act
    assert alive(x["pid"]) and alive(y["pid"]), "without their watchdogs the servers survive the owner"

    # a state file naming a live process that is not our server must never lead to a signal
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True)
    forged = state_file.ServerState(pgid=victim.pid, leader_create_time=None, server_pid=victim.pid,
                                     server_create_time=process_group.create_time(victim.pid),
                                     argv=["vllm", "serve", TI2V], host="127.0.0.1", port=1, fingerprint=x["fp"],
                                     requested_fingerprint=x["fp"], spec=spec_for().to_dict(), owner_pid=1)
    state_file.write(str(data_dir), forged)
    try:
        sup = registry.get_or_start(spec_for((0,)), make_config(data_dir))
        status = sup.status()
        assert status.pid == x["pid"] and sup.url == x["url"] and "reused the server left running" in status.text
        models = session().get(f"{sup.url}/v1/models", headers=auth(sup), timeout=10)
        assert models.status_code == 200, "the adopted server's key came from its 0600 state file"
        wait_for(lambda: not alive(y["pid"]), 30, "the unwanted left-behind server to be stopped")
        assert victim.poll() is None, "a pid that is not verifiably ours was signalled"
        names = sorted(p.name for p in (data_dir / "state").glob("*.json"))
        assert names == [f"server-{x['pgid']}.json"]
        # the adopted server is bound to us now: stopping it stops its whole group
        registry.stop_all()
        assert_no_process_left(data_dir, (x["pgid"], y["pgid"]))
    finally:
        victim.kill()
        victim.wait()


# ---- `python -m vllm_omni_launcher serve` as systemd runs it -----------------------------------
def _read_datagrams(sock: socket.socket, into: list[str]) -> None:
    """Append every datagram `sock` receives to `into`, until it is closed."""
    sock.settimeout(0.5)
    while sock.fileno() != -1:
        try:
            into.append(sock.recv(4096).decode())
        except socket.timeout:
            continue
        except OSError:
            return


def _caught_signals(pid: int) -> int:
    """The signals process `pid` has handlers for (SigCgt in /proc/PID/status), as a bit mask."""
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"^SigCgt:\s*([0-9a-f]+)", status, re.M).group(1), 16)


def test_serve_cli_notifies_systemd_and_its_sigterm_stop_leaves_nothing_to_kill(data_dir: Path,
                                                                                tmp_path: Path) -> None:
    """What systemd does with the unit `serve --print-systemd-unit` prints (Type=notify, KillMode=mixed):
    READY=1 on $NOTIFY_SOCKET once the server answers, SIGTERM to the launcher alone on stop (Ctrl-C's
    SIGINT has the same handler), then SIGKILL to whatever is left of its processes: nothing is."""
    key_file = tmp_path / "key" / "api.key"
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(tmp_path / "notify"))
    received: list[str] = []                     # read as systemd does: all the time (a full queue drops)
    reader = threading.Thread(target=lambda: _read_datagrams(notify, received), daemon=True)
    reader.start()
    env = dict(os.environ,
               VLLM_OMNI_LAUNCHER_SERVER_CMD=f"{stubserver.server_python()} {stubserver.STUB_SCRIPT}",
               VLLM_OMNI_LAUNCHER_DATA_DIR=str(data_dir), VLLM_OMNI_LAUNCHER_STARTUP_TIMEOUT_S=str(START_S),
               VLLM_OMNI_LAUNCHER_GPU_MEMORY_GB="80", PYTHONUNBUFFERED="1", NOTIFY_SOCKET=str(tmp_path / "notify"))
    cli = subprocess.Popen([sys.executable, "-m", "vllm_omni_launcher", "serve", "--model", TI2V, "--gpus", "0",
                            "--api-key-file", str(key_file)], env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    url = None
    for line in cli.stdout:
        lines.append(line)
        m = re.match(r"Serving \S+ at (http://\S+)", line)
        if m:
            url = m.group(1)
        if line.startswith("Press Ctrl-C"):
            break
    assert url, "".join(lines)
    out = "".join(lines)
    assert "starting:" in out and "ready:" in out
    key = key_file.read_text().strip()
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600 and key not in out
    assert session().get(f"{url}/v1/models", headers={"Authorization": f"Bearer {key}"}, timeout=10).status_code == 200
    pids = stub_pids(data_dir)
    assert len(pids) == 1 and alive(pids[0])
    ready = wait_for(lambda: [d for d in received if d.startswith("READY=1")], 30, "serve's READY=1")
    assert ready and "STATUS=Ready: " in ready[0], ready
    caught = _caught_signals(cli.pid)
    assert caught >> (signal.SIGTERM - 1) & 1 and caught >> (signal.SIGINT - 1) & 1
    tree = psutil.Process(cli.pid).children(recursive=True)      # the unit's cgroup, as far as a test sees it
    cli.send_signal(signal.SIGTERM)                                # systemctl stop, KillMode=mixed
    rest, _ = cli.communicate(timeout=120)
    assert cli.returncode == 0, out + rest
    assert "no server process is left" in rest
    wait_for(lambda: any(d.startswith("STOPPING=1") for d in received), 30, "serve's STOPPING=1")
    left = [(p, p.cmdline()) for p in tree if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    for p, _ in left:                                              # systemd's final SIGKILL to the cgroup
        p.kill()
    assert not left, f"systemd would have had to SIGKILL {[(p.pid, cmd) for p, cmd in left]}"
    notify.close()
    assert not key_file.exists()
    assert_no_process_left(data_dir)
