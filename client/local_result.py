"""A finished job's MP4 read from its server's storage folder, when this launcher started that server here.

Upstream (vLLM-Omni 0.26 and 0.30 alike, entrypoints/openai/storage.py `LocalStorageManager._save_sync`, called
by the video job runner as `STORAGE_MANAGER.save(video_bytes, video_id)`) writes a job's MP4 to a temporary
file in its storage folder (VLLM_OMNI_SERVER_STORAGE__PATH), fsyncs it, renames it to `<folder>/<video_id>`
(the job id itself, no extension), logs "Video request ... persisted" and only then marks the job completed;
`GET /v1/videos/{id}/content` is a FileResponse of that very file and DELETE removes it. So once a poll says
completed, that file holds every byte /content would send, and for a server of ours on this machine reading
it skips the download (about 0.16 s for a 67 MB clip on the H200 box; a read from the page cache takes
milliseconds).

Why reading it is safe: the folder is `<data_dir>/storage/<spec fingerprint>`, which the launcher made 0700 for
the server it launched and wiped at that launch (server/process/launch_prep.py, server/storage/private_files.py);
only our uid (and root) can put anything in it, and its one writer is that server, our own child. The file is
still checked as if it were not ours, since the job id is the server's text: an id that is not one plain file
name (a '/', a NUL, '.' or '..', over 255 bytes) never reaches the disk; the folder is opened with O_NOFOLLOW
and must be a folder of ours that nobody else can write to; the file is opened relative to that open folder
(dir_fd: the path is not looked up again) with O_NOFOLLOW (a link is never followed) and O_NONBLOCK (a FIFO
cannot hang the open), and fstat must show a regular file owned by us, not empty and within the download's
cap. Any other answer (another server layout, a server on another machine, a file already gone, an odd file)
returns None and the caller downloads as before: this is a shortcut only, and the bytes then go through the
one decode door (frames.decode_mp4 / probe_mp4) with the same checks as downloaded ones.
"""
from __future__ import annotations

import logging
import os
import stat
import time
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np

from ..errors.redact import untrusted_text
from .bounds import ClipBounds
from .frames import decode_mp4
from .streamed_download import StreamedVideo
from .transport import Cancelled

log = logging.getLogger(__name__)

NAME_MAX = 255                              # bytes in one file name (Linux, macOS)
_OPEN_DIR = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
_OPEN_FILE = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
# Without these the open could follow a link or hang on a FIFO: then the file is never read (HTTP as before).
SUPPORTED = all(hasattr(os, flag) for flag in ("O_DIRECTORY", "O_NOFOLLOW", "O_NONBLOCK")) and (
    os.open in os.supports_dir_fd)


@dataclass(frozen=True)
class FetchedMp4:
    """A finished job's MP4: its bytes, when the last one was in (time.monotonic), and how long reading it from
    the server's folder took (None: it was downloaded)."""

    mp4: bytes
    at: float
    disk_read_s: Optional[float] = None


def plain_name(job_id: str) -> bool:
    """Whether a server-given job id names one file right inside a folder (never a path, a dot entry or a NUL)."""
    try:
        size = len(job_id.encode("utf-8"))
    except UnicodeError:
        return False
    return 0 < size <= NAME_MAX and job_id not in (".", "..") and "/" not in job_id and "\0" not in job_id


def read_stored(folder: Optional[str], job_id: str, max_bytes: int,
                should_cancel: Optional[Callable[[], bool]] = None) -> Optional[FetchedMp4]:
    """The finished job's MP4 from `folder` (the server's storage folder; None: not a server of ours here), or None
    when it cannot be read there under the module docstring's rules (then download it). A cancel between reads
    raises transport.Cancelled, as a download's does."""
    if not folder or not SUPPORTED or not plain_name(job_id):
        return None
    start = time.monotonic()
    try:
        fd = _open_in(folder, job_id)
    except OSError as exc:
        log.debug("job %s: not read from the server's folder (%s); downloading it", untrusted_text(job_id, 80), exc)
        return None
    if fd is None:
        return None
    try:
        size = os.fstat(fd).st_size
        if not 0 < size <= max_bytes:       # empty or over the cap: the download says why in its own words
            return None
        data = _read(fd, size, should_cancel)
    except OSError:
        return None
    finally:
        os.close(fd)
    if data is None:
        return None
    now = time.monotonic()
    return FetchedMp4(data, now, now - start)


def decode_stored(stored: FetchedMp4, bounds: Optional[ClipBounds], into: Optional[np.ndarray],
                  on_downloaded: Optional[Callable[[], None]] = None) -> StreamedVideo:
    """A stored MP4's frames, through the same decode_mp4 (checks before allocation included) as a download's;
    `on_downloaded` runs first, as once a download's last byte is in (the job's DELETE then runs beside the decode:
    the bytes are already in memory)."""
    if on_downloaded is not None:
        on_downloaded()
    video = decode_mp4(stored.mp4, bounds=bounds, into=into)
    return StreamedVideo(stored.mp4, video, stored.at, time.monotonic(), disk_read_s=stored.disk_read_s)


def _open_in(folder: str, name: str) -> Optional[int]:
    """A read-only fd of `name` in `folder` when both pass the module docstring's checks, else None (OSError: the
    folder or file is not there, or is a link)."""
    dir_fd = os.open(folder, _OPEN_DIR)
    try:
        st = os.fstat(dir_fd)
        if not (stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o022):
            return None
        fd = os.open(name, _OPEN_FILE, dir_fd=dir_fd)
    finally:
        os.close(dir_fd)
    try:
        st = os.fstat(fd)
    except OSError:
        os.close(fd)
        raise
    if stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid():
        return fd
    os.close(fd)
    return None


def _read(fd: int, size: int, should_cancel: Optional[Callable[[], bool]]) -> Optional[bytes]:
    """Exactly `size` bytes of `fd` (None when the file turns out shorter); the cancel is checked before each read
    (a regular file's read usually returns all of it at once: one copy, no join)."""
    parts: list[bytes] = []
    left = size
    while left:
        if should_cancel is not None and should_cancel():
            raise Cancelled()
        part = os.read(fd, left)
        if not part:
            return None
        parts.append(part)
        left -= len(part)
    return parts[0] if len(parts) == 1 else b"".join(parts)


__all__ = ["FetchedMp4", "decode_stored", "plain_name", "read_stored"]
