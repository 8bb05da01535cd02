"""A download that can be read while it arrives: one buffer, two writers, one blocking reader.

Upstream's MP4 keeps its index (moov) after the frames (mdat), and FFmpeg's MP4 reader seeks to
that index before it reads a frame. So the video client fetches the body twice at once
(streamed_download.py): the whole file from the start (the "whole" writer) and, on a second
connection, a small `Range` suffix holding the index (the "tail" writer). The decoder reads
through `BodyBuffer.reader()`, a seekable file object whose reads block until the bytes at the
requested offset are in, so PyAV finds the index at once and then decodes frames as the rest
arrives.

Untrusted server, so the two writers are checked against each other: a byte is *visible* once
it is in the contiguous prefix the whole writer filled, or in a tail that arrived complete;
visible bytes never change (a writer that reaches one compares instead of writing, and a
difference is an error). So the bytes the decoder saw are exactly the bytes handed back as the
server's MP4. The buffer's size comes from the first answer (Content-Length, or the tail's
Content-Range total); the other must agree. Without a Content-Length the buffer grows as the
whole writer appends, and a read past what is in waits for it.
"""
from __future__ import annotations

import bisect
import io
import re
import threading
import time
from typing import Callable, Mapping, Optional

from ..errors import LauncherError

WAIT_TICK_S = 0.1                    # a blocked read wakes this often (the writers' deadlines end it)
_CONTENT_RANGE = re.compile(r"^\s*bytes\s+(\d+)-(\d+)/(\d+)\s*$")


def changed_error(offset: int) -> LauncherError:
    """Two answers of the server gave different bytes for the same offset of one file."""
    return LauncherError(
        "The server's video changed while it was being downloaded",
        f"two reads of the same file disagree at byte {offset}: the server is misbehaving "
        "(or is not vLLM-Omni)",
        "run the prompt again; if it repeats, check which program answers at the server URL",
        setting="server")


class BodyBuffer:
    """The bytes of one file as they arrive from up to two answers; see the module docstring.

    The whole writer's chunks are kept as they came off the socket (no preallocated copy, so the
    file's memory is touched once, and once more by the final join, as for a plain download)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._chunks: list[bytes] = []        # the whole writer's chunks, in order: [0, head)
        self._starts: list[int] = []          # each chunk's offset
        self._head = 0                        # [0, head) is visible
        self._size: Optional[int] = None      # the file's length, once an answer said it
        self._tail: Optional[int] = None      # [tail, size) is visible, held in _tail_bytes
        self._tail_bytes = b""
        self._whole_done = False
        self._error: Optional[BaseException] = None
        self._waited = 0.0                    # seconds the reader spent blocked on missing bytes

    # -- the writers (transport.BodySink) --------------------------------------------------------
    def whole(self, on_begin: Optional[Callable[[Mapping[str, str], Optional[int]], None]] = None) -> "WholeSink":
        """The plain GET's sink; `on_begin(headers, size)` runs once its answer's headers are in."""
        return WholeSink(self, on_begin)

    def tail(self) -> "TailSink":
        return TailSink(self)

    def _set_size(self, size: int) -> None:
        """Under the lock: fix the file's length (an answer announced it)."""
        if self._size is None:
            if size < self._head:
                raise changed_error(size)
            self._size = size
        elif size != self._size:
            raise changed_error(min(size, self._size))

    def _prefix(self, start: int, stop: int) -> bytes:
        """Under the lock: bytes [start, stop) of the visible prefix (stop <= head)."""
        first = bisect.bisect_right(self._starts, start) - 1
        parts = []
        for index in range(first, len(self._chunks)):
            begin = self._starts[index]
            if begin >= stop:
                break
            chunk = self._chunks[index]
            parts.append(chunk[max(0, start - begin):min(len(chunk), stop - begin)])
        return b"".join(parts)

    def _append(self, offset: int, chunk: bytes) -> None:
        """Under the lock: the whole writer's next chunk (from 0 again on a retry): compared where
        it covers visible bytes, kept where it extends the prefix."""
        end = offset + len(chunk)
        if self._size is not None and end > self._size:
            raise changed_error(self._size)
        seen = min(end, self._head)
        if seen > offset and self._prefix(offset, seen) != chunk[:seen - offset]:
            raise changed_error(offset)
        if end > self._head:
            if offset > self._head:
                raise RuntimeError("the whole writer must write in order")
            fresh = chunk if offset == self._head else chunk[self._head - offset:]
            if self._tail is not None and end > self._tail:
                lo = max(self._head, self._tail)
                if self._tail_bytes[lo - self._tail:end - self._tail] != fresh[lo - self._head:]:
                    raise changed_error(lo)
            self._chunks.append(fresh)
            self._starts.append(self._head)
            self._head = end
        self._cond.notify_all()

    def _add_tail(self, start: int, data: bytes) -> None:
        """Under the lock: the whole tail [start, size) arrived; compared with the visible prefix."""
        seen = min(self._head, start + len(data))
        if seen > start and self._prefix(start, seen) != data[:seen - start]:
            raise changed_error(start)
        self._tail, self._tail_bytes = start, data
        self._cond.notify_all()

    def fail(self, exc: BaseException) -> None:
        """The whole writer failed: blocked and later reads raise `exc`."""
        with self._cond:
            if self._error is None:
                self._error = exc
            self._cond.notify_all()

    def raise_failure(self) -> None:
        """Raise the whole writer's failure, if it failed."""
        with self._cond:
            if self._error is not None:
                raise self._error

    # -- results ---------------------------------------------------------------------------------
    @property
    def complete(self) -> bool:
        with self._cond:
            return self._whole_done

    def value(self) -> bytes:
        """The whole file (after the whole writer finished)."""
        with self._cond:
            if not self._whole_done:
                raise RuntimeError("the download has not finished")
            return self._chunks[0] if self._chunks else b""

    def reader(self) -> "BufferReader":
        return BufferReader(self)

    @property
    def read_wait_s(self) -> float:
        """Seconds the reader was blocked on bytes not yet in: how download-bound the decode was
        (near 0: the download kept ahead, so more connections for the body could not help)."""
        with self._cond:
            return self._waited

    # -- the reader's side -----------------------------------------------------------------------
    def _wait_size(self) -> int:
        with self._cond:
            while self._size is None and not self._whole_done:
                self._raise_or_wait()
            return self._size if self._size is not None else self._head

    def _read(self, pos: int, n: int) -> bytes:
        """Up to n bytes at pos, as soon as at least one is visible; b"" at the end of the file.
        A read stops at the end of a chunk (a short read: callers ask again)."""
        with self._cond:
            while True:
                size = self._size if self._size is not None else (self._head if self._whole_done else None)
                if size is not None and pos >= size:
                    return b""
                if pos < self._head:
                    index = bisect.bisect_right(self._starts, pos) - 1
                    begin = self._starts[index]
                    return self._chunks[index][pos - begin:pos - begin + n]
                if self._tail is not None and pos >= self._tail:
                    return self._tail_bytes[pos - self._tail:pos - self._tail + n]
                self._raise_or_wait()

    def _raise_or_wait(self) -> None:
        if self._error is not None:
            raise self._error
        start = time.monotonic()
        self._cond.wait(WAIT_TICK_S)
        self._waited += time.monotonic() - start


class WholeSink:
    """The answer to the plain GET: a 200 with the whole file, written from offset 0 (again from 0
    on a retry, then compared)."""

    def __init__(self, buffer: BodyBuffer,
                 on_begin: Optional[Callable[[Mapping[str, str], Optional[int]], None]] = None) -> None:
        self._buf = buffer
        self._on_begin = on_begin

    def begin(self, status: int, headers: Mapping[str, str], size: Optional[int]) -> int:
        if size is not None:
            with self._buf._cond:
                self._buf._set_size(size)
        if self._on_begin is not None:
            self._on_begin(headers, size)
        return 0

    def fill(self, offset: int, chunk: bytes) -> None:
        with self._buf._cond:
            self._buf._append(offset, chunk)

    def done(self, length: int) -> None:
        """The file is complete: one join into the bytes handed back, here on the download's thread
        while the decoder may still be busy (so it is off the caller's path)."""
        buf = self._buf
        with buf._cond:
            if length != buf._head or (buf._size is not None and length != buf._size):
                raise changed_error(min(length, buf._head))
            chunks = list(buf._chunks)
        whole = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        with buf._cond:
            buf._chunks, buf._starts = [whole], [0]
            buf._size = length
            buf._whole_done = True
            buf._cond.notify_all()


class TailSink:
    """The answer to `Range: bytes=-N`: a 206 with `Content-Range: bytes a-(size-1)/size`; its bytes
    become visible only once all of them are in."""

    def __init__(self, buffer: BodyBuffer) -> None:
        self._buf = buffer
        self._start = 0
        self._parts: list[bytes] = []

    def begin(self, status: int, headers: Mapping[str, str], size: Optional[int]) -> int:
        found = _CONTENT_RANGE.match(headers.get("Content-Range", ""))
        if status != 206 or found is None:
            raise _NoTail("the server did not answer the range request with one byte range")
        first, last, total = (int(g) for g in found.groups())
        if last != total - 1 or first > last or (size is not None and size != last - first + 1):
            raise _NoTail(f"unusable Content-Range {found.group(0)!r}")
        with self._buf._cond:
            self._buf._set_size(total)
        self._start, self._parts = first, []
        return first

    def fill(self, offset: int, chunk: bytes) -> None:
        self._parts.append(chunk)

    def done(self, length: int) -> None:
        with self._buf._cond:
            if self._start + length == self._buf._size:
                self._buf._add_tail(self._start, b"".join(self._parts))


class _NoTail(Exception):
    """The tail answer cannot be used (no range support, or an odd range): the reader just waits
    for the whole download."""


class BufferReader(io.RawIOBase):
    """A read-only, seekable file over a BodyBuffer whose reads block until their bytes are in."""

    def __init__(self, buffer: BodyBuffer) -> None:
        super().__init__()
        self._buf = buffer
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if whence == io.SEEK_SET:
            pos = offset
        elif whence == io.SEEK_CUR:
            pos = self._pos + offset
        elif whence == io.SEEK_END:
            pos = self._buf._wait_size() + offset
        else:
            raise ValueError(f"unknown whence {whence}")
        if pos < 0:
            raise ValueError("negative seek position")
        self._pos = pos
        return pos

    def read(self, size: int = -1) -> bytes:
        if size is None or size < 0:
            size = max(0, self._buf._wait_size() - self._pos)
        data = self._buf._read(self._pos, size) if size else b""
        self._pos += len(data)
        return data

    def readinto(self, b: bytearray) -> int:  # type: ignore[override]
        data = self.read(len(b))
        b[:len(data)] = data
        return len(data)


__all__ = ["BodyBuffer", "BufferReader", "TailSink", "WholeSink", "changed_error"]
