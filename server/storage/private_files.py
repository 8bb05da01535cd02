"""The launcher's own files: private, never reached through a link, and a full disk said in words.

Everything under the data dir can hold a secret or a user's work: state files keep the
server's API key, logs hold prompts and the server's own words, job storage holds the
generated videos. So this module is the one way in for every file the launcher writes there
(and for the GPU lock's records, gpu_lock.py), and it holds three rules:

* Private: every directory it makes is 0700 and every file 0600, set explicitly (`chmod` /
  `fchmod`) rather than left to `mkdir`/`open`, which apply the process umask; a directory or
  file an older version made too open is tightened.
* No links: a symbolic link inside the data dir could make the launcher write where it points
  (a linked lock file overwrote another file; a linked `logs/` handed our logs to another
  program's folder). Files are opened with O_NOFOLLOW and must be regular files (O_NONBLOCK,
  so a planted FIFO cannot hang the open); each folder below the data dir is checked with
  `lstat` and must be a real folder owned by us. The data dir itself may be a link (the user's
  choice, e.g. to a bigger disk), but it must be ours: since every folder below it is 0700 and
  ours, no other user can swap a component in between the check and the open (root may use
  another user's folder, as it can anyway).
* Errors in words: a full, read-only or forbidden data dir used to surface as a raw OSError
  (the CLI's "Internal error ... a bug in the launcher"). Every write here runs under
  `guarded`, which turns ENOSPC / EDQUOT / EROFS / EACCES / EPERM / ELOOP into a
  `DataDirError` naming the file, what is wrong and the setting that moves the folder. It is a
  LauncherError (the CLI and the nodes show it as such) and also an OSError, so best-effort
  writers that already ignore an OSError (a log rotation, a state refresh) keep doing so.
"""
from __future__ import annotations

import errno
import os
import stat
import time
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, Iterator, Optional, Union

from ...errors import LauncherError
from ...errors.config_names import config_file_path, env_var

DIR_MODE = 0o700
FILE_MODE = 0o600
CLOEXEC = getattr(os, "O_CLOEXEC", 0)
NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
NONBLOCK = getattr(os, "O_NONBLOCK", 0)
APPEND = os.O_WRONLY | os.O_CREAT | os.O_APPEND
REPLACE = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
CREATE_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL
DATA_DIR = "data_dir"                 # the local config setting that moves the data dir

PathLike = Union[str, "os.PathLike[str]"]

_FULL = (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC))
_DENIED = (errno.EACCES, errno.EPERM)
_AREA = {DATA_DIR: "data dir", "gpu_lock_dir": "GPU lock folder"}


class DataDirError(LauncherError, OSError):
    """A file of the launcher's own could not be written, said in words (see the module docstring)."""

    def __init__(self, what: str, why: str, fix: str, *, setting: str, kind: str, code: Optional[int]) -> None:
        super().__init__(what, why, fix, setting=setting, kind=kind)
        self.errno = code


def _move_hint(setting: str) -> str:
    """Which setting moves the folder, and where it is set."""
    return (f"move it: set \"{setting}\" in the launcher config ({config_file_path()}) "
            f"or {env_var(setting)}")


def refused(path: PathLike, why: str, fix: str, setting: str = DATA_DIR) -> DataDirError:
    """Our refusal of something found in the folder (a link, a foreign owner, not a folder)."""
    area = _AREA.get(setting, setting)
    return DataDirError(f"The launcher refuses to use {path} in its {area}", why, f"{fix}, or {_move_hint(setting)}",
                        setting=setting, kind=f"{setting}_refused", code=None)


def error_for(exc: OSError, path: PathLike, setting: str = DATA_DIR) -> Optional[DataDirError]:
    """`exc` (raised while writing `path`) in words, or None when it is not about the folder itself."""
    area = _AREA.get(setting, setting)
    where = Path(path).parent
    name = errno.errorcode.get(exc.errno or 0, "?")
    said = f"{exc.strerror or exc} ({name})"
    if exc.errno in _FULL:
        quota = exc.errno != errno.ENOSPC
        return DataDirError(
            f"The launcher's {area} is full: writing {path} failed",
            f"{said}: {'your disk quota' if quota else 'the file system'} that holds {where} has no room left",
            f"free space there (old logs are in its logs/ folder), or {_move_hint(setting)}",
            setting=setting, kind=f"{setting}_full", code=exc.errno)
    if exc.errno == errno.EROFS:
        return DataDirError(
            f"The launcher's {area} is read-only: it cannot write {path}",
            f"{said}: the file system that holds {where} is mounted read-only",
            f"{_move_hint(setting)} to a folder on a writable disk", setting=setting, kind=f"{setting}_read_only",
            code=exc.errno)
    if exc.errno in _DENIED:
        return DataDirError(
            f"The launcher may not write {path} in its {area}", f"{said}: {_owner_text(where)}",
            f"make that folder yours and writable (chown / chmod), or {_move_hint(setting)}",
            setting=setting, kind=f"{setting}_permission", code=exc.errno)
    if exc.errno == errno.ELOOP and _is_link(path):
        return refused(path, "it is a symbolic link, and the launcher never writes through one (it could point at "
                       "another file, which would be overwritten or read as ours)",
                       f"remove the link ({path})", setting)
    return None


@contextmanager
def guarded(path: PathLike, setting: str = DATA_DIR) -> Iterator[None]:
    """Run a write of `path`; a folder-level OSError becomes its DataDirError (others pass unchanged)."""
    try:
        yield
    except DataDirError:
        raise
    except OSError as exc:
        mapped = error_for(exc, path, setting)
        if mapped is None:
            raise
        raise mapped from exc


def _owner_text(folder: Path) -> str:
    try:
        st = os.stat(folder)
    except OSError:
        return f"{folder} cannot be entered"
    mine = st.st_uid == euid()
    return (f"{folder} is {'yours' if mine else f'owned by uid {st.st_uid}'} with mode "
            f"{stat.S_IMODE(st.st_mode):04o}")


def _is_link(path: PathLike) -> bool:
    try:
        return stat.S_ISLNK(os.lstat(path).st_mode)
    except OSError:
        return False


def euid() -> int:
    """Our effective uid (0 where there is none: Windows)."""
    return os.geteuid() if hasattr(os, "geteuid") else 0


def _check_owner(path: Path, st: os.stat_result, setting: str) -> None:
    me = euid()
    if me != 0 and st.st_uid != me:
        raise refused(path, f"it belongs to uid {st.st_uid}, not to you (uid {me}): its owner could swap what is "
                      "inside for links to your files", "use a folder of your own", setting)


# ---- folders ----------------------------------------------------------------------------
def private_dir(base: PathLike, *parts: str, setting: str = DATA_DIR) -> Path:
    """`base/parts...`, created as needed, each a real 0700 folder of ours afterwards.

    `base` is the launcher's data dir: its parents are the user's and left alone, and it may
    be a link; none of `parts` may be (see the module docstring).
    """
    path = Path(base).expanduser()
    with guarded(path, setting):
        path.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
        _tighten(path, os.stat(path), setting)
    for part in parts:
        path = path / part
        with guarded(path, setting):
            try:
                os.mkdir(path, DIR_MODE)
            except OSError:
                if not os.path.lexists(path):
                    raise                    # an existing folder is fine even where nothing can be made
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):
                raise refused(path, "it is a symbolic link, and the launcher never follows one inside its folder (a "
                              "linked folder would put our files, or take theirs, somewhere else)",
                              f"remove the link ({path}); the launcher makes a real folder there", setting)
            _tighten(path, st, setting)
    return path


def _tighten(path: Path, st: os.stat_result, setting: str) -> None:
    if not stat.S_ISDIR(st.st_mode):
        raise refused(path, "it is not a folder", f"move that file away ({path})", setting)
    _check_owner(path, st, setting)
    if stat.S_IMODE(st.st_mode) != DIR_MODE:
        os.chmod(path, DIR_MODE)


# ---- files --------------------------------------------------------------------------------
def open_private(path: PathLike, flags: int = APPEND, setting: str = DATA_DIR) -> int:
    """Open (creating) a regular file as 0600, never through a link; its descriptor is not
    inherited by children. The folder is private_dir's (already checked)."""
    with guarded(path, setting):
        fd = os.open(path, flags | CLOEXEC | NOFOLLOW | NONBLOCK, FILE_MODE)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise refused(path, "it is not a regular file", f"remove it ({path})", setting)
            _check_owner(Path(path), st, setting)
            if stat.S_IMODE(st.st_mode) != FILE_MODE:
                os.fchmod(fd, FILE_MODE)
            if NONBLOCK:
                os.set_blocking(fd, True)      # a regular file: the flag was only for the open itself
        except BaseException:
            os.close(fd)
            raise
    return fd


def write_all(fd: int, data: bytes, path: PathLike, setting: str = DATA_DIR) -> None:
    """Write `data` to `fd` (opened by open_private for `path`), a full disk said in words."""
    with guarded(path, setting):
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]


def rewrite(fd: int, data: bytes, path: PathLike, setting: str = DATA_DIR) -> None:
    """Replace the whole content of `fd` (a small record) with `data`."""
    with guarded(path, setting):
        os.ftruncate(fd, 0)
        os.pwrite(fd, data, 0)


class _Writer:
    """What `replacing` hands out: every write through write_all (a full disk said in words)."""

    def __init__(self, fd: int, path: PathLike, setting: str) -> None:
        self._fd, self._path, self._setting = fd, path, setting

    def write(self, data: bytes) -> None:
        write_all(self._fd, data, self._path, self._setting)


@contextmanager
def replacing(target: Path, setting: str = DATA_DIR, sync: bool = False) -> Iterator[_Writer]:
    """Write `target` atomically: a fresh 0600 temporary file beside it, renamed over it when the
    block ends (removed when it fails). `sync`: fsync before the rename (large files)."""
    tmp = target.with_name(f".{target.name}.{os.getpid()}.{time.monotonic_ns()}.tmp")
    fd = open_private(tmp, CREATE_NEW, setting)
    try:
        try:
            yield _Writer(fd, target, setting)
            if sync:
                with guarded(target, setting):
                    os.fsync(fd)
        finally:
            os.close(fd)
        with guarded(target, setting):
            os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def existing_file(path: PathLike, setting: str = DATA_DIR) -> bool:
    """Whether `path` is a regular file already (False: absent); a link or anything else there is refused."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISREG(st.st_mode):
        raise refused(path, "it is a symbolic link or not a regular file, and the launcher uses only files it "
                      "wrote itself there", f"remove it ({path})", setting)
    _check_owner(Path(path), st, setting)
    return True


# ---- reading ---------------------------------------------------------------------------
def open_read(path: PathLike) -> BinaryIO:
    """A file of ours for reading, never through a link or into a FIFO (OSError otherwise)."""
    fd = os.open(path, os.O_RDONLY | CLOEXEC | NOFOLLOW | NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        if NONBLOCK:
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_private(path: PathLike, max_bytes: int = 1 << 20) -> Optional[bytes]:
    """The content of a private file of ours (at most `max_bytes`), or None when it is a link, not
    a regular file, not ours, or readable by others: such a file was not written by us."""
    try:
        with open_read(path) as fh:
            st = os.fstat(fh.fileno())
            if st.st_mode & 0o077 or (hasattr(os, "geteuid") and st.st_uid != os.geteuid()):
                return None
            return fh.read(max_bytes)
    except OSError:
        return None
