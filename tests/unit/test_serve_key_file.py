"""`serve --api-key-file`: the key reaches its file as a new 0600 file of ours, and a link planted
where its temporary file goes is never written through (cli/serve_cmd.py, through
server/storage/private_files.replacing)."""
from __future__ import annotations

import os
import stat
from pathlib import Path
from types import SimpleNamespace

import pytest

from vllm_omni_launcher.cli import serve_cmd
from vllm_omni_launcher.errors import LauncherError
from vllm_omni_launcher.server.storage import private_files


def test_the_key_replaces_the_file_as_a_private_file_and_leaves_no_temporary_file(tmp_path: Path) -> None:
    key_path = tmp_path / "server.key"
    key_path.write_text("the previous generation's key\n")
    os.chmod(key_path, 0o644)
    serve_cmd._write_key(key_path, "sk-new")                  # noqa: SLF001
    assert key_path.read_text() == "sk-new\n"
    assert stat.S_IMODE(key_path.stat().st_mode) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["server.key"]


@pytest.mark.parametrize("target_exists", [True, False], ids=["to-a-file", "dangling"])
def test_a_link_planted_at_the_temporary_path_is_not_written_through(tmp_path: Path, monkeypatch,
                                                                     target_exists: bool) -> None:
    # A peer who guessed the temporary file's name: fix the name's clock part so the test knows it too.
    monkeypatch.setattr(private_files, "time", SimpleNamespace(monotonic_ns=lambda: 7))
    victim = tmp_path / "theirs.txt"
    if target_exists:
        victim.write_text("their file\n")
    key_path = tmp_path / "server.key"
    planted = tmp_path / f".server.key.{os.getpid()}.7.tmp"
    planted.symlink_to(victim)

    with pytest.raises(LauncherError) as caught:
        serve_cmd._write_key(key_path, "sk-secret")           # noqa: SLF001

    assert (victim.read_text() == "their file\n") if target_exists else not os.path.lexists(victim)
    assert planted.is_symlink() and os.readlink(planted) == str(victim), "the planted link is left as found"
    assert not key_path.exists()
    err = caught.value
    assert err.setting == "--api-key-file"
    assert err.what == f"The API key was not written to {key_path}"
    assert err.why.startswith(f"{planted} is already there (a link or a file someone else put there)")
    assert "never through a link" in err.why
    assert err.fix.startswith(f"remove {planted}, or give --api-key-file a path in a folder that only you can write")
    assert "sk-secret" not in str(err)
