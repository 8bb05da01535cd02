"""Cancel during a launch (issue 11): the process group is gone within 2 s, LaunchCancelled is raised.
The bound is cancel_latency.LAUNCH_CANCEL_S, the one every launch-cancel test asserts.

The "server" here is a fault: a process that ignores SIGINT/SIGTERM, has a child that does
too, never answers HTTP and (optionally) keeps writing a download into the Hugging Face
cache, so the cancel must escalate to SIGKILL of the whole group. The real-server version
(cancel while the stub loads weights) is in tests/contract/test_supervisor_faults.py.
"""
from __future__ import annotations

import re
import sys
import textwrap
import time
from pathlib import Path
from typing import Optional

import pytest

from cancel_latency import LAUNCH_CANCEL_S
from processes import alive
from vllm_omni_launcher.errors import LauncherError
from vllm_omni_launcher.server import registry
from vllm_omni_launcher.server.logs import failures
from vllm_omni_launcher.server.process import gpu_lock, process_group
from vllm_omni_launcher.server.config.local_config import LocalConfig
from vllm_omni_launcher.server.registry import LaunchCancelled, Status
from vllm_omni_launcher.server.launch.spec import LaunchSpec
from vllm_omni_launcher.server.supervision.supervisor import Supervisor

TI2V = "Wan-AI/Wan2.2-TI2V-5B-Diffusers"
STUBBORN = textwrap.dedent("""
    import os, signal, subprocess, sys, time
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    child = subprocess.Popen([sys.executable, "-c", "import signal, time\\n"
                              "signal.signal(signal.SIGTERM, signal.SIG_IGN)\\nwhile True: time.sleep(1)"])
    print("FAKE_PID=%d FAKE_PID=%d" % (os.getpid(), child.pid), flush=True)
    blobs = os.environ.get("FAKE_BLOBS")
    while True:
        if blobs:
            os.makedirs(blobs, exist_ok=True)
            with open(os.path.join(blobs, "0123abcd.incomplete"), "ab") as fh:
                fh.write(b"\\0" * 1_000_000)
        time.sleep(0.2)
""")


def config_for(data_dir: Path, **extra_env: str) -> LocalConfig:
    return LocalConfig(server_command=(sys.executable, "-c", STUBBORN), data_dir=str(data_dir),
                       startup_timeout_s=600, extra_env=dict(extra_env))


def fake_pids(data_dir: Path) -> list[int]:
    return [int(p) for log in data_dir.glob("logs/*.log") for p in re.findall(r"FAKE_PID=(\d+)", log.read_text())]


class CancelWhen:
    """A should_cancel that turns true once `ready()` does, remembering when."""

    def __init__(self, ready) -> None:
        self.ready, self.at = ready, None

    def __call__(self) -> bool:
        if self.at is None and self.ready():
            self.at = time.monotonic()
        return self.at is not None


def assert_nothing_left(data_dir: Path, pgid: Optional[int], pids: list[int]) -> None:
    assert len(pids) == 2, pids
    assert not [p for p in pids if alive(p)], "a server process outlived the cancel"
    assert pgid is not None and process_group.group_members(pgid) == []
    assert list(data_dir.glob("state/*.json")) == []
    gpu_lock.acquire(None, (0,), gpu_lock.Holder.this_process()).release()   # the GPU is free again


def test_cancel_while_starting_stops_the_stubborn_group_within_2s(tmp_path: Path) -> None:
    sup = Supervisor(LaunchSpec(model=TI2V, gpus=(0,)), config_for(tmp_path))
    pgids: list[Optional[int]] = []

    def started() -> bool:
        if len(fake_pids(tmp_path)) < 2:
            return False
        pgids.append(sup.pgid)
        return True
    cancel = CancelWhen(started)
    with pytest.raises(LaunchCancelled) as caught:
        sup.start(should_cancel=cancel)
    took = time.monotonic() - cancel.at
    assert took < LAUNCH_CANCEL_S, f"cancel took {took:.2f} s (the issue allows 2 s)"
    err = caught.value
    assert isinstance(err, LauncherError) and err.kind == failures.CANCELLED
    assert "queue the prompt" in err.fix and "Starting" in err.why, "says what it was doing when cancelled"
    assert_nothing_left(tmp_path, pgids[0], fake_pids(tmp_path))
    status = sup.status()
    assert status.phase == "stopped" and status.text.startswith("Start cancelled") and status.pid is None
    assert status.last_error is None, "a cancel is not an error"


def test_download_progress_then_cancel_through_the_registry(tmp_path: Path) -> None:
    hf = tmp_path / "hf"
    blobs = hf / "hub" / ("models--" + TI2V.replace("/", "--")) / "blobs"
    seen: list[Status] = []
    cancel = CancelWhen(lambda: any(s.phase == "downloading" and s.progress and s.progress[0] >= 2 for s in seen))
    pgids: list[Optional[int]] = []

    def on_status(status: Status) -> None:
        seen.append(status)
        if status.pid is not None and not pgids:
            pgids.append(registry.all_servers()[0].pgid)

    with pytest.raises(LaunchCancelled):
        registry.get_or_start(LaunchSpec(model=TI2V, gpus=(0,)), config_for(tmp_path, HF_HOME=str(hf),
                                                                               FAKE_BLOBS=str(blobs)),
                              on_status=on_status, should_cancel=cancel)
    assert time.monotonic() - cancel.at < LAUNCH_CANCEL_S
    assert registry.all_servers() == [], "a cancelled new server is forgotten"
    assert_nothing_left(tmp_path, pgids[0], fake_pids(tmp_path))
    downloads = [s for s in seen if s.phase == "downloading"]
    assert downloads and all(s.progress is not None and s.progress[1:] == (None, "MB") for s in downloads)
    done = [s.progress[0] for s in downloads]
    assert done == sorted(done) and done[-1] >= 2, done
    assert "MB so far" in downloads[-1].text
    assert all(a != b for a, b in zip(seen, seen[1:])), "the status callback fires on change only"
    assert seen[0].phase == "starting" and seen[-1].phase == "stopped"
