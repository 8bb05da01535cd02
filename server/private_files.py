"""The launcher's files are private: 0700 directories, 0600 files, whatever the umask says.

Everything under the data dir can hold a secret or a user's work: state files keep the
server's API key, logs hold prompts and the server's own words, job storage holds the
generated videos, lock files name the command that holds a GPU. So every directory the
launcher makes there is 0700 and every file it writes is 0600. The mode is set explicitly
after creation (`chmod` / `fchmod`) rather than left to `mkdir`/`open`, which apply the
process umask (a umask of 0 would otherwise make nothing stricter, and an unusual one
could even drop our own bits); a directory an older version made too open is tightened too.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Union

DIR_MODE = 0o700
FILE_MODE = 0o600
APPEND = os.O_WRONLY | os.O_CREAT | os.O_APPEND
REPLACE = os.O_WRONLY | os.O_CREAT | os.O_TRUNC

PathLike = Union[str, "os.PathLike[str]"]


def private_dir(base: PathLike, *parts: str) -> Path:
    """`base/parts...`, created as needed; `base` and each part are 0700 afterwards.

    `base` is the launcher's data dir (its parents are the user's and left alone).
    """
    path = Path(base).expanduser()
    _ensure_dir(path)
    for part in parts:
        path = path / part
        _ensure_dir(path)
    return path


def _ensure_dir(path: Path) -> None:
    path.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    if path.stat().st_mode & 0o777 != DIR_MODE:
        os.chmod(path, DIR_MODE)


def open_private(path: PathLike, flags: int = APPEND) -> int:
    """Open (creating) a file as 0600 and return its descriptor (not inherited by children)."""
    fd = os.open(path, flags | os.O_CLOEXEC, FILE_MODE)
    try:
        os.fchmod(fd, FILE_MODE)
    except BaseException:
        os.close(fd)
        raise
    return fd
