"""A joined replica (`serve --join`) has no HTTP port, so what the
launcher says about it names its GPUs and its head, never a port or URL; and its readiness check
counts the registration lines its log follower already read.

The supervisor runs for real here; the "headless runtime" is a fake of the GPU engine (a process that
prints upstream's registration line, then waits), and the head's registration port is our own
listener on 127.0.0.1. The same role runs the real vLLM-Omni 0.30 in tests/contract/test_join_head.py."""
from __future__ import annotations

import os
import signal
import socket
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Iterator

import pytest

from vllm_omni_launcher.server.config.local_config import LocalConfig
from vllm_omni_launcher.server.logs.log_follower import LogFollower
from vllm_omni_launcher.server.supervision.multi_host import HeadlessRun, JoinRole, Registrations
from vllm_omni_launcher.server.supervision.restart_policy import RestartPolicy
from vllm_omni_launcher.server.launch.spec import LaunchSpec
from vllm_omni_launcher.server.supervision.status import Status
from vllm_omni_launcher.server.supervision.supervisor import Supervisor

TI2V = "Wan-AI/Wan2.2-TI2V-5B-Diffusers"
LINE = ("(StageDiffusionProc pid=9) INFO 12:00:00 StageDiffusionProc registered with OmniCoordinator "
        "(stage_id=0 replica_id={} coord=tcp://127.0.0.1:5555)\n")
HEADLESS = textwrap.dedent(f"""
    import sys, time
    print({LINE.format(0)!r}, end="", flush=True)
    while True:
        time.sleep(0.2)
""")
WAIT_S = 90.0          # generous: a start here is a process spawn on a loaded 2-core machine


class Head:
    """A registration port that accepts (and drops) every connection until closed."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            conn.close()

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def head() -> Iterator[Head]:
    peer = Head()
    yield peer
    peer.close()


def _wait(what, timeout: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while not what():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def _no_port(text: str, head_port: int) -> bool:
    return "http" not in text and "(port" not in text and "port " not in text.replace(
        f"registration port 127.0.0.1:{head_port}", "")


def test_every_text_about_a_joined_replica_names_its_gpus_and_head_and_no_port(tmp_path: Path, head: Head) -> None:
    config = LocalConfig(server_command=(sys.executable, "-c", HEADLESS), data_dir=str(tmp_path),
                         startup_timeout_s=600)
    role = JoinRole("127.0.0.1", head.port, None, 120.0)
    sup = Supervisor(LaunchSpec(model=TI2V, gpus=(1,)), config, api_key=False, role=role,
                     restart_policy=RestartPolicy(max_restarts=1, backoff_s=(0.1,)))
    seen: list[Status] = []
    at_head = f"the head at 127.0.0.1:{head.port}"
    try:
        sup.start(on_status=seen.append, timeout=WAIT_S)
        starting = [s.text for s in seen if s.phase == "starting"]
        assert starting and starting[0] == f"Starting 1 replica of {TI2V} on GPU 1, to register with {at_head}"
        assert sup.status().text == f"Ready: 1 replica of {TI2V} (GPU 1) registered with {at_head}"
        assert sup.url == "" and sup.status().url == ""        # nothing to name, nor to advertise in the GPU lock
        assert role.joined_text(sup.spec) == (f"1 replica of {TI2V} on GPU 1 registered with {at_head}; "
                                              "clients use the head's endpoint")

        victim = sup._run.server_pid                            # noqa: SLF001 - the fake runtime's process
        assert victim is not None
        os.kill(victim, signal.SIGKILL)                         # a crash: restarted, ready again
        _wait(lambda: sup.generation >= 2 and sup.status().phase == "ready")
        assert sup.status().text.endswith(f". Ready on GPU 1, registered with {at_head} (generation 2)"), \
            sup.status().text

        head.close()                                            # the head is gone: the budget (1) is spent
        _wait(lambda: sup.status().phase == "failed")
        assert sup.status().text.startswith("Gave up after 1 restart") and \
            f"registration port 127.0.0.1:{head.port} refuses connections" in sup.status().text
    finally:
        sup.stop(timeout=10)
    texts = [s.text for s in seen]
    assert {"starting", "ready", "restarting", "failed"} <= {s.phase for s in seen}, texts
    assert [t for t in texts if not _no_port(t, head.port)] == [], texts
    assert any(s.phase == "restarting" for s in seen)


def test_a_crash_report_of_a_joined_replica_names_no_port(tmp_path: Path) -> None:
    """The failure context of a run without HTTP has no port (an "Address already in use" there is
    one of upstream's own sockets, not a port the launcher picked)."""
    sup = Supervisor(LaunchSpec(model=TI2V, gpus=(0,)), LocalConfig(data_dir=str(tmp_path)), api_key=False,
                     role=JoinRole("127.0.0.1", 29555, None, 120.0))
    run = HeadlessRun.__new__(HeadlessRun)
    run.port = 41234
    sup._run = run                                              # noqa: SLF001
    assert sup.failure_context(sup.spec, 1, ever_ready=True).port is None
    plain = Supervisor(LaunchSpec(model=TI2V, gpus=(0,)), LocalConfig(data_dir=str(tmp_path)))
    plain._run = run                                            # noqa: SLF001
    assert plain.failure_context(plain.spec, 1, ever_ready=True).port == 41234


# ---- readiness counts the registrations the log follower already read -----------------------------------
def test_registrations_come_from_the_follower_lines_and_pass_them_on(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    line = LINE.format(12).encode()
    cut = line.index(b"replica_id=1") + len(b"replica_id=1")   # "replica_id=1" of "replica_id=12"
    log.write_bytes(b"loading\n" + line[:cut])
    passed: list[tuple[str, bool]] = []
    registrations = Registrations(lambda text, ends: passed.append((text, ends)))
    follower = LogFollower(str(log), registrations.segment)
    follower.poll_once()
    assert registrations.count() == 0                           # not replica 1: the line is not complete
    with open(log, "ab") as fh:
        fh.write(line[cut:] + line)                              # the rest, and the same replica again
    follower.poll_once()
    assert registrations.count() == 1
    with open(log, "ab") as fh:
        fh.write(LINE.format(3).encode())
    follower.poll_once()
    assert registrations.count() == 2
    assert [text for text, ends in passed if ends][0] == "loading"      # every line still reaches the supervisor
    assert sum("registered with OmniCoordinator" in text for text, _ in passed) == 3


def test_a_readiness_look_reads_no_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    registrations = Registrations(lambda text, ends: None)
    run = HeadlessRun.__new__(HeadlessRun)
    run.log_path, run.expected, run.registrations = str(tmp_path / "server.log"), 1, registrations
    registrations.segment(LINE.format(0).rstrip("\n"), True)
    monkeypatch.setattr("builtins.open", lambda *a, **k: pytest.fail("a readiness look opened a file"))
    assert run.registered() == 1 and run.answers()
