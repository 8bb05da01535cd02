"""One server per GPU on this machine, across launcher processes that share a data dir.

Inside one process the registry stops a server before another starts on an overlapping GPU.
Across processes (`python -m vllm_omni_launcher serve` and a ComfyUI, two ComfyUIs) nothing
did, and two servers loading onto one GPU both run out of memory. So a launch first takes a
lock per GPU in `<data_dir>/locks/`, held by the launching process for the server's life
(restarts included) and released when it stops:

* a server on GPUs 0 and 1: exclusive `flock` on `gpu-0.lock` and `gpu-1.lock`, plus a
  shared one on `all.lock`;
* a server on "all visible GPUs" (no GPU list, and no plain CUDA_VISIBLE_DEVICES list in its
  environment): exclusive on `all.lock`, which conflicts with every per-GPU holder.
  Counting the GPUs instead (NVML) was rejected: NVML is often missing where the launcher
  runs (CI, containers without the driver library), and "all" must exclude GPUs the count
  could not see.

`flock` belongs to the open file: the kernel drops it when the holder exits however it
exits (SIGKILL included), so a stale lock of a dead process is simply free, and the new
holder rewrites the holder record inside (pid, its create time, command, model, URL), which
a refused launcher quotes in its error. The holder's descriptors are close-on-exec, so a
server never inherits them. The files are 0600 in a 0700 directory (they name a command).
"""
from __future__ import annotations

try:
    import fcntl
except ImportError:      # Windows: no flock; a local server is refused there before any lock (platform_check.py)
    fcntl = None  # type: ignore[assignment]
import json
import os
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Mapping, Optional

from . import failures, private_files, process_group

Gpus = Optional[tuple[int, ...]]      # None: every GPU the server can see
ALL_FILE = "all.lock"


@dataclass(frozen=True)
class Holder:
    """Who holds a lock: written into the lock files, quoted to whoever is refused."""

    pid: int
    create_time: Optional[float]
    command: str
    model: str = ""
    url: str = ""
    gpus: str = ""
    since: float = 0.0

    @classmethod
    def this_process(cls, model: str = "") -> "Holder":
        pid = os.getpid()
        return cls(pid, process_group.create_time(pid), _command_line(pid), model=model, since=time.time())

    def describe(self) -> str:
        alive = process_group.create_time(self.pid)
        gone = alive is None or (self.create_time is not None and abs(alive - self.create_time) >= 0.05)
        where = "" if not self.gpus else (" on all visible GPUs" if self.gpus == "all visible" else
                                          f" on GPU{'s' if ',' in self.gpus else ''} {self.gpus}")
        at = f" at {self.url}" if self.url else ""
        note = " (that process has exited; a child it forked still holds the lock)" if gone else ""
        return f"process {self.pid} ({self.command}) runs {self.model or 'a vLLM-Omni server'}{where}{at}{note}"


def _command_line(pid: int) -> str:
    """The holder's command for a message: one line, inline `-c` code elided, at most 200 chars."""
    argv = list(process_group.cmdline(pid) or sys.argv)
    for i, arg in enumerate(argv[:-1]):
        if arg == "-c":
            argv[i + 1] = "..."
            break
    text = " ".join(" ".join(argv).split())
    return text if len(text) <= 200 else text[:197] + "..."


def targets(gpus: Gpus, env: Mapping[str, str]) -> Gpus:
    """The GPUs a server will use: the spec's list, else its environment's CUDA_VISIBLE_DEVICES
    when that is a plain list of indices, else None (all of them)."""
    if gpus is not None:
        return tuple(sorted(set(gpus)))
    visible = env.get("CUDA_VISIBLE_DEVICES", "").replace(" ", "")
    parts = [p for p in visible.split(",") if p]
    if parts and all(p.isdigit() for p in parts):
        return tuple(sorted({int(p) for p in parts}))
    return None      # unset, UUIDs or MIG names: we cannot tell which, so claim all


def describe(gpus: Gpus) -> str:
    return "all visible GPUs" if gpus is None else ("GPU " if len(gpus) == 1 else "GPUs ") + ",".join(map(str, gpus))


class GpuLock:
    """A held claim on some GPUs; `release()` (or the process exiting) frees it."""

    def __init__(self, directory: Path, gpus: Gpus, fds: list[int], record_fds: list[int], holder: Holder) -> None:
        self.directory = directory
        self.gpus = gpus
        self._fds = fds
        self._record_fds = record_fds
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
        for fd in self._record_fds:
            os.ftruncate(fd, 0)
            os.pwrite(fd, data, 0)

    def release(self) -> None:
        for fd in self._record_fds:
            try:
                os.ftruncate(fd, 0)          # no stale record for the next reader
            except OSError:
                pass
        for fd in self._fds:
            try:
                os.close(fd)                 # closing the file drops its flock
            except OSError:
                pass
        self._fds, self._record_fds = [], []


def acquire(data_dir: str, gpus: Gpus, holder: Holder) -> GpuLock:
    """Claim `gpus` (None: all) for `holder`, or raise a ServerFailure (kind gpu_busy) that
    names the process holding them and what to do."""
    directory = private_files.private_dir(data_dir, "locks")
    gpus = None if gpus is None else tuple(sorted(set(gpus)))
    holder = replace(holder, gpus="all visible" if gpus is None else ",".join(map(str, gpus)))
    fds: list[int] = []
    try:
        all_fd = _open(directory / ALL_FILE)
        fds.append(all_fd)
        if not _try_lock(all_fd, fcntl.LOCK_EX if gpus is None else fcntl.LOCK_SH):
            raise _busy(gpus, data_dir, _holders_blocking(directory, gpus))
        records = [all_fd] if gpus is None else []
        for gpu in gpus or ():
            fd = _open(directory / f"gpu-{gpu}.lock")
            fds.append(fd)
            if not _try_lock(fd, fcntl.LOCK_EX):
                raise _busy(gpus, data_dir, [_read_record(directory / f"gpu-{gpu}.lock")])
            records.append(fd)
        return GpuLock(directory, gpus, fds, records, holder)
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise


def _open(path: Path) -> int:
    return private_files.open_private(path, os.O_RDWR | os.O_CREAT)


def _try_lock(fd: int, mode: int) -> bool:
    try:
        fcntl.flock(fd, mode | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


def _held_by_someone(path: Path) -> bool:
    """Probe with a lock of our own, dropped at once."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        return not _try_lock(fd, fcntl.LOCK_EX)
    finally:
        os.close(fd)


def _read_record(path: Path) -> Optional[Holder]:
    try:
        data = json.loads(path.read_text() or "null")
        return Holder(**data) if isinstance(data, dict) else None
    except (OSError, ValueError, TypeError):
        return None


def _holders_blocking(directory: Path, gpus: Gpus) -> list[Optional[Holder]]:
    """Who holds `all.lock` against us: per-GPU holders (shared) when we want all GPUs,
    else the one holder of all GPUs (exclusive)."""
    if gpus is None:
        found = [_read_record(p) for p in sorted(directory.glob("gpu-*.lock")) if _held_by_someone(p)]
        if found:
            return found
    return [_read_record(directory / ALL_FILE)]


def _busy(gpus: Gpus, data_dir: str, holders: list[Optional[Holder]]) -> failures.ServerFailure:
    known = [h for h in holders if h is not None]
    who = "; ".join(h.describe() for h in known) or "another launcher process (its record is being written)"
    urls = [h.url for h in known if h.url]
    use = f"use that server instead (Remote Server node or `generate --url {urls[0]}`), " if urls else ""
    verb = "is" if gpus is not None and len(gpus) == 1 else "are"
    return failures.ServerFailure(
        failures.GPU_BUSY, f"{describe(gpus)[0].upper()}{describe(gpus)[1:]} {verb} already in use by another "
        "launcher process", f"{who}; two servers on one GPU would compete for its memory (locks in {data_dir})",
        f"{use}stop it first (Stop Server in that ComfyUI, Ctrl-C on its `serve`), or select other GPUs",
        setting="gpus")
