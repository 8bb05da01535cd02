"""One server per GPU on this machine, across every launcher process of every user.

Inside one process the registry stops a server before another starts on an overlapping GPU.
Across processes (`python -m vllm_omni_launcher serve` and a ComfyUI, two ComfyUIs, two users)
nothing did, and two servers loading onto one GPU both run out of memory. So a launch first
takes a lock per GPU, held by the launching process for the server's life (restarts included)
and released when it stops:

* a server on GPUs 0 and 1: exclusive `flock` on `gpu-0.lock` and `gpu-1.lock`, plus a
  shared one on `all.lock`;
* a server on "all visible GPUs" (no GPU list, and no CUDA_VISIBLE_DEVICES that gpu_ids.py can
  map): exclusive on `all.lock`, which conflicts with every per-GPU holder. Counting the GPUs
  instead (NVML) was rejected: NVML is often missing where the launcher runs (CI, containers
  without the driver library), and "all" must exclude GPUs the count could not see.

Where: one folder for the whole machine, `gpu_lock_dir` in the local config, by default
`/tmp/vllm-omni-launcher-gpu-locks`. It used to be `<data_dir>/locks`, and ComfyUI
(`user/vllm_omni_launcher`) and `serve` (`~/.cache/vllm-omni-launcher`) have different data
dirs, so both served on GPU 0. Not `$XDG_RUNTIME_DIR` (unset for services, cron, `su`, most
containers: ComfyUI as a service and `serve` in a login shell would not meet) nor `$TMPDIR`
(differs per shell and job) nor a per-user folder (another user's server on the GPU would be
invisible): a fixed path that every process of every user computes alike. A process with its
own /tmp (systemd's PrivateTmp, a container) is pointed at a shared folder with the setting.

The folder is shared like /tmp: created 1777 (sticky: nobody removes another's files), and an
existing one is used only when it is a real folder (not a link), and sticky if others may
write to it. The lock files are empty and 0644, so every user can open them and lock; the
kernel's flock list (/proc/locks, lock_holders.py) says who holds one. What a refused user of
the same account is told (pid, command, model, URL) comes from a private record per holder
beside the lock, `<lock>.<uid>.json` (0600, written through private_files.py, never through a
link; a record that is not ours is ignored). Another user is named with their user name, pid and
command only. What a hostile local user can do here, they can do anyway by using the GPU: hold
a lock (the refusal names them), or squat a name so that our record cannot be written (the
refusal then names the pid and command without the URL). They cannot make us write through a
link or read a record they wrote.

`flock` belongs to the open file: the kernel drops it when the holder exits however it exits
(SIGKILL included), so a stale lock of a dead process is simply free, and the new holder
rewrites its record. The holder's descriptors are close-on-exec, so a server never inherits them.
"""
from __future__ import annotations

try:
    import fcntl
except ImportError:      # Windows: no flock; a local server is refused there before any lock (platform_check.py)
    fcntl = None  # type: ignore[assignment]
import errno
import json
import os
import stat
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Mapping, Optional

from ..config import local_config
from ..logs import failures
from ..storage import private_files
from . import gpu_ids, lock_holders, process_group
from .gpu_ids import Gpus

ALL_FILE = "all.lock"
SETTING = "gpu_lock_dir"
LOCK_MODE = 0o644                      # empty; readable by every user so that every user can lock it
SHARED_DIR_MODE = 0o1777


@dataclass(frozen=True)
class Holder:
    """Who holds a lock: written into its record, quoted to whoever is refused."""

    pid: int
    create_time: Optional[float]
    command: str
    model: str = ""
    url: str = ""
    gpus: str = ""
    since: float = 0.0
    user: str = ""                    # set only for another user's process (no record of theirs is read)

    @classmethod
    def this_process(cls, model: str = "") -> "Holder":
        pid = os.getpid()
        return cls(pid, process_group.create_time(pid), _command_line(pid), model=model, since=time.time())

    def describe(self) -> str:
        alive = process_group.create_time(self.pid)
        gone = alive is None or (self.create_time is not None and abs(alive - self.create_time) >= 0.05)
        if self.user:
            note = " (that process has exited; a child it forked still holds the lock)" if alive is None else ""
            return f"process {self.pid} of user {self.user} ({self.command or 'command hidden'}){note}"
        where = "" if not self.gpus else (" on all visible GPUs" if self.gpus == "all visible" else
                                          f" on GPU{'s' if ',' in self.gpus else ''} {self.gpus}")
        at = f" at {self.url}" if self.url else ""
        note = " (that process has exited; a child it forked still holds the lock)" if gone else ""
        return f"process {self.pid} ({self.command}) runs {self.model or 'a vLLM-Omni server'}{where}{at}{note}"


def _command_line(pid: int) -> str:
    """The holder's command for a message: one line, inline `-c` code elided, at most 200 chars."""
    argv = list(process_group.cmdline(pid) or (sys.argv if pid == os.getpid() else []))
    for i, arg in enumerate(argv[:-1]):
        if arg == "-c":
            argv[i + 1] = "..."
            break
    text = " ".join(" ".join(argv).split())
    return text if len(text) <= 200 else text[:197] + "..."


def targets(gpus: Gpus, env: Mapping[str, str], uuid_index: gpu_ids.UuidIndex = gpu_ids.nvml_uuids) -> Gpus:
    """The GPUs a server will use: the spec's list, else what its environment's
    CUDA_VISIBLE_DEVICES names (indices and UUIDs, gpu_ids.py), else None (all of them)."""
    if gpus is not None:
        return tuple(sorted(set(gpus)))
    return gpu_ids.visible_gpus(env.get("CUDA_VISIBLE_DEVICES", ""), uuid_index)


def describe(gpus: Gpus) -> str:
    return "all visible GPUs" if gpus is None else ("GPU " if len(gpus) == 1 else "GPUs ") + ",".join(map(str, gpus))


def lock_dir(configured: Optional[str]) -> Path:
    """The machine's lock folder (`configured`, else the default), made or checked (module docstring)."""
    path = Path(configured or local_config.default_gpu_lock_dir()).expanduser()
    with private_files.guarded(path, SETTING):
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.mkdir(path, 0o700)
            os.chmod(path, SHARED_DIR_MODE)           # explicitly: mkdir applies the umask
        except FileExistsError:
            pass
        st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise private_files.refused(path, "it is a symbolic link or not a folder, and the GPU locks must be where "
                                    "every launcher process finds the same files", f"remove it ({path})", SETTING)
    if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
        raise private_files.refused(path, f"others may write to it (mode {stat.S_IMODE(st.st_mode):04o}) and it "
                                    "is not sticky, so anyone could replace the lock files",
                                    f"`chmod 1777 {path}` (as its owner), or remove it", SETTING)
    return path


class GpuLock:
    """A held claim on some GPUs; `release()` (or the process exiting) frees it."""

    def __init__(self, directory: Path, gpus: Gpus, fds: list[int], records: list[tuple[Path, int]],
                 holder: Holder) -> None:
        self.directory = directory
        self.gpus = gpus
        self._fds = fds
        self._records = records
        self.holder = holder
        self._write()

    def __repr__(self) -> str:
        return f"GpuLock({describe(self.gpus)}, held={bool(self._fds)})"

    @property
    def held(self) -> bool:
        return bool(self._fds)

    def update(self, *, url: Optional[str] = None, model: Optional[str] = None) -> None:
        """Rewrite the holder record (the URL is known only once the port is chosen)."""
        self.holder = replace(self.holder, url=self.holder.url if url is None else url,
                              model=self.holder.model if model is None else model)
        self._write()

    def _write(self) -> None:
        data = json.dumps(asdict(self.holder)).encode()
        for path, fd in self._records:
            try:
                private_files.rewrite(fd, data, path, SETTING)
            except OSError:
                pass                        # a record only informs; the flock is the lock

    def release(self) -> None:
        for _, fd in self._records:
            try:
                os.ftruncate(fd, 0)          # no stale record for the next reader
                os.close(fd)
            except OSError:
                pass
        for fd in self._fds:
            try:
                os.close(fd)                 # closing the file drops its flock
            except OSError:
                pass
        self._fds, self._records = [], []


def acquire(where: Optional[str], gpus: Gpus, holder: Holder) -> GpuLock:
    """Claim `gpus` (None: all) for `holder` in the lock folder `where` (None: the machine's), or
    raise a ServerFailure (kind gpu_busy) that names the process holding them and what to do."""
    directory = lock_dir(where)
    gpus = None if gpus is None else tuple(sorted(set(gpus)))
    holder = replace(holder, gpus="all visible" if gpus is None else ",".join(map(str, gpus)))
    fds: list[int] = []
    try:
        all_path = directory / ALL_FILE
        fds.append(_open_lock(all_path))
        if not _try_lock(fds[-1], fcntl.LOCK_EX if gpus is None else fcntl.LOCK_SH):
            raise _busy(gpus, directory, _holders(directory, all_path, writers_only=gpus is not None))
        mine = [all_path] if gpus is None else []
        for gpu in gpus or ():
            path = directory / f"gpu-{gpu}.lock"
            fds.append(_open_lock(path))
            if not _try_lock(fds[-1], fcntl.LOCK_EX):
                raise _busy(gpus, directory, _holders(directory, path))
            mine.append(path)
        return GpuLock(directory, gpus, fds, [r for r in map(_open_record, mine) if r is not None], holder)
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise



class GpuClaim:
    """The GPU lock one supervisor holds across its server's generations: kept across restarts on
    the same GPUs, swapped when they change, the running server's URL shown in it."""

    def __init__(self, where: Optional[str]) -> None:
        self._where = where
        self._lock: Optional[GpuLock] = None

    def claim(self, gpus: Gpus, model: str) -> None:
        """Hold `gpus` for this process's server of `model` (raises like `acquire`)."""
        held = self._lock
        if held is not None and held.held and held.gpus == gpus:
            return
        self.release()
        self._lock = acquire(self._where, gpus, Holder.this_process(model))

    def show_url(self, url: Optional[str]) -> None:
        if self._lock is not None:
            self._lock.update(url=url)

    def release(self) -> None:
        held, self._lock = self._lock, None
        if held is not None:
            held.release()

def _open_lock(path: Path) -> int:
    """Open a lock file for flock, never through a link; made 0644 by whoever comes first. Without
    O_CREAT first: Linux's protected_regular refuses O_CREAT on another user's file in a sticky folder."""
    flags = os.O_RDONLY | private_files.CLOEXEC | private_files.NOFOLLOW | private_files.NONBLOCK
    with private_files.guarded(path, SETTING):
        try:
            fd = os.open(path, flags)
        except FileNotFoundError:
            try:
                fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, LOCK_MODE)
            except FileExistsError:
                fd = os.open(path, flags)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise private_files.refused(path, "it is not a regular file", f"remove it ({path})", SETTING)
            if st.st_uid == private_files.euid() and stat.S_IMODE(st.st_mode) != LOCK_MODE:
                os.fchmod(fd, LOCK_MODE)
            os.set_blocking(fd, True)
        except BaseException:
            os.close(fd)
            raise
    return fd


def _record_path(lock: Path, uid: int) -> Path:
    return lock.with_name(f"{lock.name}.{uid}.json")


def _open_record(lock: Path) -> Optional[tuple[Path, int]]:
    path = _record_path(lock, private_files.euid())
    try:
        return path, private_files.open_private(path, os.O_RDWR | os.O_CREAT, SETTING)
    except OSError:
        return None                           # squatted or unwritable: the lock holds without its record


def _try_lock(fd: int, mode: int) -> bool:
    try:
        fcntl.flock(fd, mode | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    except OSError as exc:
        if exc.errno in (errno.EAGAIN, errno.EACCES):
            return False
        raise


def _read_record(path: Path) -> Optional[Holder]:
    raw = private_files.read_private(path, 64 * 1024)
    try:
        data = json.loads(raw or b"null")
        return Holder(**data) if isinstance(data, dict) else None
    except (ValueError, TypeError):
        return None


def _holders(directory: Path, lock: Path, writers_only: bool = False) -> list[Optional[Holder]]:
    """Who holds `lock` against us (`writers_only`: only exclusive holders block a shared claim),
    from the kernel's list; our own user's holders from their records (any of ours with that pid:
    a per-GPU holder records on its GPU files, not on all.lock)."""
    me = private_files.euid()
    found: list[Optional[Holder]] = []
    for pid in lock_holders.flock_pids(lock, writers_only=writers_only):
        who = lock_holders.owner(pid)
        if who is None or who[0] != me:
            found.append(Holder(pid, None, _command_line(pid), user=who[1] if who else "another user"))
            continue
        records = (_read_record(p) for p in sorted(directory.glob(f"*.lock.{me}.json")))
        found.append(next((h for h in records if h is not None and h.pid == pid), None)
                     or Holder(pid, process_group.create_time(pid), _command_line(pid)))
    return found or [_read_record(_record_path(lock, me))]


def _busy(gpus: Gpus, directory: Path, holders: list[Optional[Holder]]) -> failures.ServerFailure:
    known = [h for h in holders if h is not None]
    who = "; ".join(h.describe() for h in known) or "another launcher process (its record is being written)"
    urls = [h.url for h in known if h.url]
    users = sorted({h.user for h in known if h.user})
    use = f"use that server instead (Remote Server node or `generate --url {urls[0]}`), " if urls else ""
    stop = (f"ask {' and '.join(users)} to stop it (another user's launcher)" if users else
            "stop it first (Stop Server in that ComfyUI, Ctrl-C on its `serve`)")
    verb = "is" if gpus is not None and len(gpus) == 1 else "are"
    unlisted = ("; a server with no GPU list (or a CUDA_VISIBLE_DEVICES without NVML to map it) claims all "
                "visible GPUs") if gpus is None else ""
    return failures.ServerFailure(
        failures.GPU_BUSY, f"{describe(gpus)[0].upper()}{describe(gpus)[1:]} {verb} already in use by another "
        "launcher process", f"{who}; two servers on one GPU would compete for its memory (locks in {directory})"
        f"{unlisted}", f"{use}{stop}, or select other GPUs", setting="gpus")
