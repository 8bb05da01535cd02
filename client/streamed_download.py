"""The server's MP4, decoded while it downloads.

Measured on one H200 (1280x704x121, a 54 MB MP4 from random weights): the /content download
took 0.17 s and the decode 0.26 s, one after the other. Upstream's encoder writes the index
(moov) after the frames, and FFmpeg's MP4 reader reads that index before any frame, so a plain
streamed read could only start decoding once the last byte was in. Upstream serves /content
with Starlette's FileResponse, which honours `Range` (and says so: `Accept-Ranges: bytes`); so
once the plain GET (on a worker thread) has its headers, and the file is at least
TAIL_MIN_BYTES, a second connection asks for the last TAIL_BYTES (`Range: bytes=-N`; the index
of any Wan clip is a few KB). The decoder (the caller's thread) reads through a
body_buffer.BodyBuffer that hands out bytes as soon as either answer has them, so the decode
runs while the frames arrive; what is left after the last byte is the last frames' decode.
Measured on the H200 box's 16 cores (46 MB noise clip like a random-weight model's, served by
FileResponse): download 0.11 s, decode from bytes 0.21 s, both one after the other 0.32 s,
streamed 0.22 s.

Everything that bounds a plain download still holds: the cap on bytes (Content-Length checked
before anything is read), the body deadline, the retries, the cancel (it stops the download,
which ends the decoder's wait). The decoder checks the stream against the request's ClipBounds
before it allocates frames, as for bytes. The tail is only a speed-up: a server without range
support, an odd range answer or a failed tail leaves the decoder waiting for the plain GET; a
tail that disagrees with the plain GET's bytes is an error (body_buffer.py). The tail's thread
ends by itself within run_try's tick once the whole file is in.
"""
from __future__ import annotations

import dataclasses
import threading
import time
from dataclasses import dataclass
from typing import Callable, Mapping, Optional

import numpy as np

from .body_buffer import BodyBuffer
from .bounds import ClipBounds
from .frames import AVIO_BUFFER_BYTES, THREAD_TYPE, DecodedVideo, decode_mp4
from .transport import ONE_TRY, Transport

TAIL_BYTES = 256 << 10          # the suffix fetched for the index: a Wan clip's moov is a few KB
TAIL_MIN_BYTES = 1 << 20        # below this the whole file is in within milliseconds anyway
TAIL_FIRST_BYTE_S = 5.0         # the tail is a speed-up: a slow answer is simply not waited for
TAIL_BODY_S = 30.0


@dataclass
class StreamedVideo:
    """The server's file, its decoded frames, and when each was complete (time.monotonic)."""

    mp4: bytes
    video: DecodedVideo
    downloaded_at: float
    decoded_at: float
    read_wait_s: float = 0.0       # the decoder's time blocked on bytes not yet downloaded
    disk_read_s: Optional[float] = None   # read from the server's own folder instead (local_result.py): seconds


def download_decoding(http: Transport, path: str, *, what: str, job_id: str, max_bytes: int, cap_reason: str,
                      bounds: Optional[ClipBounds], should_cancel: Optional[Callable[[], bool]] = None,
                      tail: bool = True, workers: Optional[int] = None, threads: int = 0,
                      thread_type: str = THREAD_TYPE, buffer_size: int = AVIO_BUFFER_BYTES,
                      into: Optional[np.ndarray] = None,
                      on_downloaded: Optional[Callable[[], None]] = None) -> StreamedVideo:
    """GET `path` (at most max_bytes) and decode it as it arrives; see the module docstring.

    `tail`: also fetch the file's end on a second connection when the server offers ranges and
    the file is large (off: decode still streams, but a file with its index at the end waits
    for the last byte). `workers`, `threads`, `thread_type`, `buffer_size`, `into`: decode_mp4's.
    `on_downloaded`: called on the download's thread once every byte is in (the video client starts
    the job's DELETE there, so it runs beside the decode's last frames); it raises as the download
    would. Raises what the download raises (LauncherError, transport.Cancelled) before any decode
    error, then decode_mp4's LauncherError.
    """
    buffer = BodyBuffer()
    stop = threading.Event()               # the decode failed: stop downloading
    tail_started = threading.Event()
    done: dict[str, float] = {}

    def stopped() -> bool:
        return stop.is_set() or (should_cancel is not None and should_cancel())

    def start_tail(headers: Mapping[str, str], size: Optional[int]) -> None:
        ranges = "bytes" in headers.get("Accept-Ranges", "").lower()
        if tail and ranges and size is not None and size >= TAIL_MIN_BYTES and not tail_started.is_set():
            tail_started.set()
            threading.Thread(target=tail_part, name="vllm-omni-download-tail", daemon=True).start()

    def whole() -> None:
        try:
            http.request("GET", path, what=what, job_id=job_id, large_body=True, max_body=max_bytes,
                         cap_reason=cap_reason, should_cancel=stopped, sink=buffer.whole(start_tail))
            done["downloaded"] = time.monotonic()
            if on_downloaded is not None:
                on_downloaded()
        except BaseException as exc:  # noqa: BLE001 - handed to the reader, raised on the caller's thread
            if not stop.is_set():          # else it only says that we stopped it
                buffer.fail(exc)

    def tail_part() -> None:
        deadlines = dataclasses.replace(http.deadlines, first_byte_s=min(http.deadlines.first_byte_s,
                                                                         TAIL_FIRST_BYTE_S),
                                        body_s=min(http.deadlines.body_s, TAIL_BODY_S))
        try:
            http.request("GET", path, what=what, job_id=job_id, large_body=True, max_body=TAIL_BYTES,
                         ok=lambda status: status == 206, retry=ONE_TRY, deadlines=deadlines,
                         headers={"Range": f"bytes=-{TAIL_BYTES}"},
                         should_cancel=lambda: stopped() or buffer.complete, sink=buffer.tail())
        except BaseException:  # noqa: BLE001 - a tail is optional; the plain GET has every byte
            pass

    getter = threading.Thread(target=whole, name="vllm-omni-download", daemon=True)
    getter.start()
    try:
        video = decode_mp4(buffer.reader(), bounds=bounds, workers=workers, threads=threads,
                           thread_type=thread_type, buffer_size=buffer_size, into=into)
        decoded_at = time.monotonic()
    except BaseException:
        stop.set()
        getter.join()
        buffer.raise_failure()             # the download's own error explains a failed decode best
        raise
    getter.join()
    buffer.raise_failure()
    return StreamedVideo(buffer.value(), video, done["downloaded"], max(decoded_at, done["downloaded"]),
                         buffer.read_wait_s)


__all__ = ["StreamedVideo", "TAIL_BYTES", "download_decoding"]
