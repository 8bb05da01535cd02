"""One server per GPU across launcher processes (issue 10.7): real second processes hold the locks (here in a
lock folder of the test's; test_machine_gpu_lock.py covers the machine-wide default)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Optional

import pytest

from vllm_omni_launcher.server.logs import failures
from vllm_omni_launcher.server.process import gpu_lock
from vllm_omni_launcher.server.logs.failures import ServerFailure
from vllm_omni_launcher.server.config.local_config import LocalConfig
from vllm_omni_launcher.server.launch.spec import LaunchSpec
from vllm_omni_launcher.server.supervision.supervisor import Supervisor

# Another launcher process: takes the lock like a supervisor does, says so, then waits to be killed.
HOLDER = textwrap.dedent("""
    import sys, time
    from vllm_omni_launcher.server.process import gpu_lock
    gpus = None if sys.argv[2] == "all" else tuple(int(g) for g in sys.argv[2].split(","))
    lock = gpu_lock.acquire(sys.argv[1], gpus, gpu_lock.Holder.this_process("Wan2.2-TI2V-5B"))
    lock.update(url="http://127.0.0.1:18091")
    print("locked", flush=True)
    time.sleep(600)
""")


class OtherLauncher:
    """A second launcher process holding `gpus` in `data_dir` until killed."""

    def __init__(self, data_dir: Path, gpus: str) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(data_dir), gpus, "--pretend-serve"],
                                     stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None and self.proc.stdout.readline().strip() == "locked"

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()


@pytest.fixture
def other(tmp_path: Path):
    holders: list[OtherLauncher] = []

    def start(gpus: str) -> OtherLauncher:
        holders.append(OtherLauncher(tmp_path, gpus))
        return holders[-1]
    yield start
    for h in holders:
        h.kill()


def record_of(lock_dir: Path, lock: str) -> Path:
    """The holder record this user writes beside a lock file."""
    return lock_dir / f"{lock}.{os.geteuid()}.json"


def refusal(data_dir: Path, gpus: Optional[tuple[int, ...]]) -> ServerFailure:
    with pytest.raises(ServerFailure) as caught:
        gpu_lock.acquire(str(data_dir), gpus, gpu_lock.Holder.this_process("me"))
    return caught.value


def test_a_second_process_on_the_same_gpu_is_refused_with_the_holder_named(tmp_path: Path, other) -> None:
    holder = other("0")
    err = refusal(tmp_path, (0,))
    assert err.kind == failures.GPU_BUSY and err.setting == "gpus"
    assert err.what == "GPU 0 is already in use by another launcher process"
    assert f"process {holder.proc.pid}" in err.why and "--pretend-serve" in err.why, "pid and command"
    assert "runs Wan2.2-TI2V-5B on GPU 0 at http://127.0.0.1:18091" in err.why, "model, GPUs and URL"
    assert "--url http://127.0.0.1:18091" in err.fix and "select other GPUs" in err.fix
    # other GPUs are free; "all GPUs" overlaps GPU 0
    gpu_lock.acquire(str(tmp_path), (1,), gpu_lock.Holder.this_process("me")).release()
    everything = refusal(tmp_path, None)
    assert everything.what.startswith("All visible GPUs are already in use") and str(holder.proc.pid) in everything.why


def test_all_gpus_holder_blocks_every_gpu(tmp_path: Path, other) -> None:
    holder = other("all")
    for gpus in ((0,), (3, 5), None):
        err = refusal(tmp_path, gpus)
        assert f"process {holder.proc.pid}" in err.why and "on all visible GPUs" in err.why


def test_a_dead_holders_lock_is_taken_over_and_its_record_rewritten(tmp_path: Path, other) -> None:
    holder = other("0,1")
    holder.kill()                                   # SIGKILL: no cleanup ran
    lock = gpu_lock.acquire(str(tmp_path), (1, 0), gpu_lock.Holder.this_process("mine"))
    try:
        assert lock.gpus == (0, 1)
        for gpu in (0, 1):
            record = json.loads(record_of(tmp_path, f"gpu-{gpu}.lock").read_text())
            assert record["pid"] == os.getpid() and record["model"] == "mine" and record["gpus"] == "0,1"
        lock.update(url="http://127.0.0.1:1")
        assert json.loads(record_of(tmp_path, "gpu-0.lock").read_text())["url"] == "http://127.0.0.1:1"
    finally:
        lock.release()
    assert record_of(tmp_path, "gpu-0.lock").read_text() == "", "a released lock keeps no stale record"
    gpu_lock.acquire(str(tmp_path), None, gpu_lock.Holder.this_process("all")).release()


def test_lock_targets_follow_the_servers_visible_devices() -> None:
    assert gpu_lock.targets((1, 0), {"CUDA_VISIBLE_DEVICES": "3"}) == (0, 1), "the spec's list wins"
    assert gpu_lock.targets(None, {"CUDA_VISIBLE_DEVICES": "2, 3"}) == (2, 3)
    assert gpu_lock.targets(None, {}) is None
    assert gpu_lock.targets(None, {"CUDA_VISIBLE_DEVICES": "GPU-5f3c1e2a"}, lambda: None) is None, \
        "UUIDs without NVML to map them: claim all"


def test_supervisor_refuses_before_touching_anything(tmp_path: Path, other) -> None:
    """A start on a GPU another launcher holds fails before any port, log, storage or process."""
    holder = other("0")
    spec = LaunchSpec(model="Wan-AI/Wan2.2-TI2V-5B-Diffusers", gpus=(0,))
    storage = tmp_path / "storage" / spec.fingerprint()
    storage.mkdir(parents=True)
    (storage / "job.mp4").write_bytes(b"the other server's job")
    config = LocalConfig(server_command=(sys.executable, "-c", "raise SystemExit('must not run')"),
                         data_dir=str(tmp_path), gpu_lock_dir=str(tmp_path))
    sup = Supervisor(spec, config)
    with pytest.raises(ServerFailure) as caught:
        sup.start()
    assert caught.value.kind == failures.GPU_BUSY and str(holder.proc.pid) in caught.value.why
    assert (storage / "job.mp4").exists(), "the other server's job storage is untouched"
    assert not list(tmp_path.glob("logs/*.log")), "no log: nothing was launched"
    status = sup.status()
    assert status.phase == "failed" and status.last_error_kind == failures.GPU_BUSY and status.pid is None
