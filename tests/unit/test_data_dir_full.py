"""A full, read-only or forbidden data dir is said in words (issue 24): what is full or read-only, where, and the
setting that moves the data dir, in the node's error and on the command line (exit 1, a launcher error, never
exit 70's "Internal error ... a bug in the launcher").

A read-only folder is made with chmod where that stops us; root is not stopped by modes, so there the file
system's own answer (EROFS) is injected for every write under it. A full disk (ENOSPC, EDQUOT) is injected at
the write itself: the fault is what these tests stand in for, the launcher code under it is the real one."""
from __future__ import annotations

import errno
import json
import os
import sys
from pathlib import Path

import pytest

from vllm_omni_launcher.cli import main
from vllm_omni_launcher.cli.exit_codes import ExitCode
from vllm_omni_launcher.errors import LauncherError
from vllm_omni_launcher.planner.launch_plan import GPU_MEMORY_ENV
from vllm_omni_launcher.server.storage import state_file
from vllm_omni_launcher.server.config.local_config import LocalConfig
from vllm_omni_launcher.server.launch.spec import LaunchSpec
from vllm_omni_launcher.server.supervision.supervisor import Supervisor

TI2V = "Wan-AI/Wan2.2-TI2V-5B-Diffusers"


@pytest.fixture
def read_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A read-only folder `mounted` and the error kind the launcher must report for a data dir in it."""
    folder = tmp_path / "mounted"
    folder.mkdir()
    os.chmod(folder, 0o555)
    try:
        if not os.access(folder, os.W_OK):
            yield folder, "data_dir_permission"          # EACCES: the mode stops us
            return
        real_mkdir, real_open = os.mkdir, os.open

        def mkdir(path, *args, **kwargs):
            if str(path).startswith(str(folder)):
                raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
            return real_mkdir(path, *args, **kwargs)

        def open_(path, flags, *args, **kwargs):
            if str(path).startswith(str(folder)) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
                raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
            return real_open(path, flags, *args, **kwargs)
        monkeypatch.setattr(os, "mkdir", mkdir)
        monkeypatch.setattr(os, "open", open_)
        yield folder, "data_dir_read_only"
    finally:
        os.chmod(folder, 0o755)                           # so that pytest can clean it up


def full_disk(data: Path, monkeypatch: pytest.MonkeyPatch, code: int = errno.ENOSPC) -> None:
    """Every write to a file under `data` fails as on a full disk (or a used-up quota)."""
    real_write = os.write

    def write(fd, payload):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            target = ""
        if target.startswith(str(data)):
            raise OSError(code, os.strerror(code))
        return real_write(fd, payload)
    monkeypatch.setattr(os, "write", write)


def fake_server_config(tmp_path: Path, data: Path) -> LocalConfig:
    script = tmp_path / "fake_server.py"
    script.write_text("raise SystemExit('a server must not start when its log cannot be written')\n")
    return LocalConfig(server_command=(sys.executable, str(script)), data_dir=str(data))


def start_error(config: LocalConfig) -> LauncherError:
    """What the Local Server node shows: the error Supervisor.start raises."""
    with pytest.raises(LauncherError) as caught:
        Supervisor(LaunchSpec(model=TI2V, gpus=(0,)), config).start(timeout=60)
    return caught.value


def test_a_read_only_data_dir_is_named_with_the_setting_that_moves_it(tmp_path: Path, read_only) -> None:
    parent, kind = read_only
    data = parent / "launcher"
    err = start_error(fake_server_config(tmp_path, data))
    assert err.kind == kind and err.setting == "data_dir"
    if kind == "data_dir_read_only":
        assert err.what.startswith(f"The launcher's data dir is read-only: it cannot write {data}")
        assert "Read-only file system (EROFS)" in err.why and f"holds {parent}" in err.why
    else:
        assert err.what.startswith(f"The launcher may not write {data}") and "(EACCES)" in err.why
    assert '"data_dir" in the launcher config' in err.fix and "VLLM_OMNI_LAUNCHER_DATA_DIR" in err.fix
    assert "bug" not in str(err)


def test_a_full_disk_at_the_log_is_said_before_any_server_starts(tmp_path: Path, monkeypatch) -> None:
    data = tmp_path / "data"
    full_disk(data / "logs", monkeypatch)
    err = start_error(fake_server_config(tmp_path, data))
    assert err.kind == "data_dir_full" and err.setting == "data_dir"
    assert err.what.startswith(f"The launcher's data dir is full: writing {data / 'logs'}")
    assert "No space left on device (ENOSPC)" in err.why and f"holds {data / 'logs'}" in err.why
    assert err.fix.startswith("free space there (old logs are in its logs/ folder), or move it")
    assert list((data / "state").glob("*.json")) == [], "no server was started, so none is recorded"


def test_a_used_up_quota_at_a_state_file_leaves_no_temporary_file(tmp_path: Path, monkeypatch) -> None:
    data = tmp_path / "data"
    state_dir = state_file.state_dir(str(data))
    full_disk(state_dir, monkeypatch, errno.EDQUOT)
    state = state_file.ServerState(pgid=3, leader_create_time=None, server_pid=None, server_create_time=None,
                                   argv=[], host="127.0.0.1", port=1, fingerprint="f", requested_fingerprint="f",
                                   spec={}, api_key="k")
    with pytest.raises(LauncherError) as caught:
        state_file.write(str(data), state)
    assert caught.value.kind == "data_dir_full" and "your disk quota" in caught.value.why
    assert list(state_dir.iterdir()) == []


def test_the_command_line_exits_1_with_the_words_not_70_internal_error(tmp_path: Path, monkeypatch, capsys,
                                                                       read_only, server_env_python: str) -> None:
    """`serve` with a read-only data dir: a launcher error (exit 1) saying what and where, not a traceback."""
    parent, kind = read_only
    config = tmp_path / "config.json"
    script = tmp_path / "fake_server.py"
    script.write_text("raise SystemExit('must not start')\n")
    config.write_text(json.dumps({"server_command": [server_env_python, str(script)]}))
    monkeypatch.setenv("VLLM_OMNI_LAUNCHER_CONFIG", str(config))
    monkeypatch.setenv("VLLM_OMNI_LAUNCHER_DATA_DIR", str(parent / "launcher"))
    monkeypatch.setenv(GPU_MEMORY_ENV, "80")        # this machine's GPUs are not what is tested
    code = main(["serve", "--model", TI2V, "--gpus", "0", "--startup-timeout", "30"])
    err = capsys.readouterr().err
    assert code == ExitCode.LAUNCHER_ERROR, err
    assert "Internal error" not in err and "Traceback" not in err
    said = "is read-only" if kind == "data_dir_read_only" else "may not write"
    assert said in err and str(parent / "launcher") in err and "VLLM_OMNI_LAUNCHER_DATA_DIR" in err
