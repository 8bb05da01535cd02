"""Nothing the launcher writes is reached through a symbolic link (issue 24): a link planted in the data dir or
the GPU lock folder is refused with our message naming it, and what it points at is left as it was."""
from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from vllm_omni_launcher.errors import LauncherError
from vllm_omni_launcher.server.launch import lora_files
from vllm_omni_launcher.server.process import gpu_lock, launch_prep, log_files
from vllm_omni_launcher.server.storage import private_files, state_file
from vllm_omni_launcher.server.config.local_config import LocalConfig
from vllm_omni_launcher.server.logs.log_follower import LogFollower
from vllm_omni_launcher.server.launch.spec import LaunchSpec

SPEC = LaunchSpec(model="Wan-AI/Wan2.2-TI2V-5B-Diffusers", gpus=(0,))
SHOWN = {"argv": ["vllm", "serve", SPEC.model], "env": {}}


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    """Another program's folder, with a file the links below point at."""
    other = tmp_path / "other-program"
    other.mkdir()
    (other / "precious.txt").write_text("another program's data\n")
    return other


def unchanged(victim: Path) -> bool:
    return sorted(p.name for p in victim.iterdir()) == ["precious.txt"] and \
        (victim / "precious.txt").read_text() == "another program's data\n"


def refusal(call) -> LauncherError:
    with pytest.raises(LauncherError) as caught:
        call()
    return caught.value


def test_a_linked_logs_folder_is_refused_and_the_other_programs_folder_untouched(tmp_path: Path, victim: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "logs").symlink_to(victim)
    err = refusal(lambda: log_files.open_log(str(data), SPEC, 1, SHOWN))
    assert err.what == f"The launcher refuses to use {data / 'logs'} in its data dir"
    assert "symbolic link" in err.why and f"remove the link ({data / 'logs'})" in err.fix
    assert err.setting == "data_dir" and "VLLM_OMNI_LAUNCHER_DATA_DIR" in err.fix
    assert isinstance(err, OSError), "best-effort writers that ignore an OSError still do"
    assert unchanged(victim), "no log was created in, and nothing pruned from, the linked folder"


def test_a_link_at_a_log_file_is_never_written_through(tmp_path: Path, victim: Path) -> None:
    logs = private_files.private_dir(tmp_path / "data", "logs")
    planted = logs / "planted.log"
    planted.symlink_to(victim / "precious.txt")
    err = refusal(lambda: private_files.open_private(planted))
    assert err.what.endswith(f"refuses to use {planted} in its data dir") and "symbolic link" in err.why
    assert unchanged(victim)


def test_rotation_never_writes_through_a_linked_dot1_and_still_bounds_the_log(tmp_path: Path, victim: Path) -> None:
    log = private_files.private_dir(tmp_path / "data", "logs") / "server.log"
    log.write_bytes(b"x" * 300 + b"\n")
    Path(str(log) + ".1").symlink_to(victim / "precious.txt")
    follower = LogFollower(str(log), lambda text, ends: None, max_bytes=100)
    assert follower.poll_once()
    assert unchanged(victim), "the rotated copy did not go through the link"
    assert log.stat().st_size == 0, "the log was still truncated: the bound holds without the copy"


def test_a_linked_log_is_not_read_either(tmp_path: Path, victim: Path) -> None:
    log = tmp_path / "server.log"
    log.symlink_to(victim / "precious.txt")
    seen: list[str] = []
    assert not LogFollower(str(log), lambda text, ends: seen.append(text)).poll_once()
    assert seen == [], "another file's content never reaches the log parser or the UI"


def test_a_linked_state_folder_is_refused_and_a_linked_state_file_is_not_trusted(tmp_path: Path,
                                                                                   victim: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "state").symlink_to(victim)
    err = refusal(lambda: state_file.read_all(str(data)))
    assert err.what == f"The launcher refuses to use {data / 'state'} in its data dir"
    (data / "state").unlink()
    state = state_file.ServerState(pgid=7, leader_create_time=None, server_pid=None, server_create_time=None,
                                   argv=[], host="127.0.0.1", port=1, fingerprint="f", requested_fingerprint="f",
                                   spec={}, api_key="secret-key")
    forged = victim / "forged.json"
    forged.write_text(json.dumps({**state.__dict__, "pgid": 8}))
    os.chmod(forged, 0o600)
    state_file.path_for(str(data), 8).symlink_to(forged)
    assert state_file.read(state_file.path_for(str(data), 8)) is None, "a linked state file is never adopted"
    forged.unlink()
    target = state_file.write(str(data), state)
    assert json.loads(target.read_text())["api_key"] == "secret-key" and unchanged(victim)


def test_a_linked_storage_folder_is_refused_before_anything_in_it_is_wiped(tmp_path: Path, victim: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (victim / SPEC.fingerprint()).mkdir()
    (victim / SPEC.fingerprint() / "job.mp4").write_bytes(b"another program's video")
    (data / "storage").symlink_to(victim)
    err = refusal(lambda: launch_prep.prepare(SPEC, LocalConfig(data_dir=str(data)), ["vllm"], str(data), True,
                                              None, lambda: False))
    assert err.what == f"The launcher refuses to use {data / 'storage'} in its data dir"
    assert (victim / SPEC.fingerprint() / "job.mp4").read_bytes() == b"another program's video"


def test_a_link_in_place_of_a_scaled_lora_copy_is_refused(tmp_path: Path, victim: Path) -> None:
    folder = private_files.private_dir(tmp_path / "data", lora_files.FOLDER)
    planted = folder / "style-0123456789abcdef-x0.5.safetensors"
    planted.symlink_to(victim / "precious.txt")
    err = refusal(lambda: private_files.existing_file(planted))
    assert "symbolic link" in err.why and str(planted) in err.what
    assert unchanged(victim)


def test_a_linked_gpu_lock_file_or_record_is_refused_and_its_target_untouched(tmp_path: Path,
                                                                              victim: Path) -> None:
    locks = tmp_path / "locks"
    locks.mkdir()
    (locks / "gpu-0.lock").symlink_to(victim / "precious.txt")
    err = refusal(lambda: gpu_lock.acquire(str(locks), (0,), gpu_lock.Holder.this_process("me")))
    assert err.what == f"The launcher refuses to use {locks / 'gpu-0.lock'} in its GPU lock folder"
    assert err.setting == "gpu_lock_dir" and "VLLM_OMNI_LAUNCHER_GPU_LOCK_DIR" in err.fix
    (locks / "gpu-0.lock").unlink()
    (locks / f"gpu-0.lock.{os.geteuid()}.json").symlink_to(victim / "precious.txt")
    lock = gpu_lock.acquire(str(locks), (0,), gpu_lock.Holder.this_process("me"))
    lock.update(url="http://127.0.0.1:1")
    lock.release()
    assert unchanged(victim), "the holder record was not written through the link (it is only information)"


def test_a_linked_gpu_lock_folder_is_refused(tmp_path: Path, victim: Path) -> None:
    (tmp_path / "locks").symlink_to(victim)
    err = refusal(lambda: gpu_lock.acquire(str(tmp_path / "locks"), (0,), gpu_lock.Holder.this_process()))
    assert err.what == f"The launcher refuses to use {tmp_path / 'locks'} in its GPU lock folder"
    assert unchanged(victim)


def test_a_fifo_planted_as_a_lock_file_is_refused_without_hanging(tmp_path: Path) -> None:
    locks = tmp_path / "locks"
    locks.mkdir()
    os.mkfifo(locks / "all.lock")
    done: list[BaseException] = []
    opener = threading.Thread(target=lambda: done.append(refusal(
        lambda: gpu_lock.acquire(str(locks), (0,), gpu_lock.Holder.this_process()))), daemon=True)
    opener.start()
    opener.join(timeout=60)
    assert done and "not a regular file" in str(done[0])


def test_the_data_dir_itself_may_be_a_link_of_the_users_choosing(tmp_path: Path) -> None:
    """Pointing data_dir at a bigger disk through a link is the user's choice; only links inside it are refused."""
    real = tmp_path / "big-disk" / "launcher"
    real.mkdir(parents=True)
    (tmp_path / "data").symlink_to(real)
    path, fd = log_files.open_log(str(tmp_path / "data"), SPEC, 1, SHOWN)
    os.close(fd)
    assert Path(path).resolve().parent == real / "logs"
