"""The supervisor against the stub server over its lifetime: keep-alive, spec changes, owner death, adoption,
the serve CLI.

Real `vllm serve --omni` code, fake GPU; how the cases check and share servers: supervised_stub.py.
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
from pathlib import Path
from typing import Any, Callable

import psutil
import pytest

import stubserver
from processes import alive, assert_no_process_left, stub_pids
from stubserver import wait_for
from supervised_jobs import auth, session
from supervised_stub import START_S, TI2V, make_config, spec_for

from vllm_omni_launcher.server import registry
from vllm_omni_launcher.server.process import process_group
from vllm_omni_launcher.server.storage import state_file
from vllm_omni_launcher.server.launch.spec import RuntimeConfig
from vllm_omni_launcher.server.registry import Status


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
    # the launch that stops them says so in its own status, before it starts
    with lock:
        told = [s.text for name, s in events[:first_c] if name == "c" and s.phase == "stopping"]
    assert told == [f"Stopping {TI2V} on GPU {gpu} to free it for {TI2V} (that server starts again when a workflow "
                    "needs it)" for gpu in (0, 1)]


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
    watchdogs = (x["pgid"], y["pgid"])          # each group's leader is the server's watchdog
    for leader in watchdogs:                    # the watchdogs die first, then the owner
        os.kill(leader, signal.SIGKILL)
    owner.kill()
    owner.wait()
    wait_for(lambda: not any(alive(leader) for leader in watchdogs), 30, "the killed watchdogs to be gone")
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
