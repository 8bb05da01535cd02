"""Everything the launcher writes under its data dir is private (issue 10.8), whatever the umask."""
from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Iterator

import pytest

from vllm_omni_launcher.server.process import gpu_lock, launch_prep, log_files
from vllm_omni_launcher.server.storage import private_files, state_file
from vllm_omni_launcher.server.config.local_config import LocalConfig
from vllm_omni_launcher.server.logs.log_follower import LogFollower
from vllm_omni_launcher.server.launch.spec import LaunchSpec

SPEC = LaunchSpec(model="Wan-AI/Wan2.2-TI2V-5B-Diffusers", gpus=(0,))


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def no_umask() -> Iterator[None]:
    """umask 0: a file created with the default mode would be world-writable."""
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


def test_data_dir_and_every_subdir_are_0700(tmp_path: Path, no_umask: None) -> None:
    data = tmp_path / "data"
    (data / "logs").mkdir(parents=True, mode=0o755)         # made too open by something earlier
    os.chmod(data, 0o755)
    log_files.logs_dir(str(data))
    state_file.state_dir(str(data))
    launch_prep.prepare(SPEC, LocalConfig(data_dir=str(data)), ["vllm"], str(data), True, None, lambda: False)
    dirs = [data, data / "logs", data / "state", data / "storage", data / "storage" / SPEC.fingerprint()]
    assert {str(d.relative_to(tmp_path)): mode(d) for d in dirs} == {str(d.relative_to(tmp_path)): 0o700
                                                                     for d in dirs}


def test_logs_rotated_logs_state_and_lock_files_are_0600(tmp_path: Path, no_umask: None) -> None:
    data = str(tmp_path / "data")
    shown = {"argv": ["vllm", "serve", SPEC.model], "env": {"VLLM_API_KEY": "***"}}
    log_path, fd = log_files.open_log(data, SPEC, 1, shown)
    os.write(fd, b"x" * 300 + b"\n")
    os.close(fd)
    follower = LogFollower(log_path, lambda text, ends: None, max_bytes=100)
    assert follower.poll_once()                     # past max_bytes: copy-truncate into .log.1
    rotated = Path(log_path + ".1")
    assert rotated.read_bytes().endswith(b"x" * 300 + b"\n") and os.path.getsize(log_path) == 0
    state = state_file.write(data, state_file.ServerState(
        pgid=1, leader_create_time=None, server_pid=None, server_create_time=None, argv=[], host="127.0.0.1",
        port=1, fingerprint="f", requested_fingerprint="f", spec={}, api_key="k"))
    locks = tmp_path / "locks"
    lock = gpu_lock.acquire(str(locks), (0,), gpu_lock.Holder.this_process())
    lock.release()
    records = [locks / f"{name}.{os.geteuid()}.json" for name in ("gpu-0.lock",)]
    files = [Path(log_path), rotated, state, *records]
    assert {f.name: mode(f) for f in files} == {f.name: 0o600 for f in files}
    # The lock files themselves are empty and 0644 in a sticky 1777 folder: every user of the machine
    # must be able to open them to lock (their holders' records above stay private).
    assert (mode(locks), mode(locks / "gpu-0.lock"), mode(locks / "all.lock")) == (0o1777, 0o644, 0o644)
    assert (locks / "gpu-0.lock").read_bytes() == b"" and (locks / "all.lock").read_bytes() == b""


def test_an_existing_rotated_log_is_tightened_when_rewritten(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_bytes(b"y" * 200)
    rotated = tmp_path / "server.log.1"
    rotated.write_bytes(b"old")
    os.chmod(rotated, 0o644)
    LogFollower(str(log), lambda text, ends: None, max_bytes=100).poll_once()
    assert mode(rotated) == 0o600 and rotated.read_bytes() == b"y" * 200


def test_open_private_sets_0600_even_for_a_file_that_existed(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_text("")
    os.chmod(path, 0o666)
    os.close(private_files.open_private(path))
    assert mode(path) == 0o600
