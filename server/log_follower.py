"""Follow the server's log file as it is written, split into `\\r` / `\\n` segments.

The server writes straight into a file (not a pipe): a pipe would block the server once
our reader lags 64 KiB behind, and it would break (EPIPE) the moment ComfyUI exits, while a
file keeps working and lets a restarted ComfyUI adopt the server and keep reading it.
tqdm redraws a bar with carriage returns, so the stream is split on both `\\r` and `\\n`
and every segment is handed on; what the segments mean is logwatch.py's business.
"""
from __future__ import annotations

import codecs
import os
import threading
from collections import deque
from typing import Callable, Optional

from . import private_files
from .logwatch import bar_text, clean, strip_prefix

ROTATE_AT_BYTES = 256 * 1024 * 1024
ROTATED_KEEP_BYTES = 16 * 1024 * 1024


class Splitter:
    """Incremental UTF-8 decode and split on `\\r`, `\\n` and `\\r\\n`.

    `feed` returns complete segments as (text, ends_line); the unfinished tail is kept and
    exposed by `pending` so a bar drawn without its trailing `\\r` yet can be read early.
    """

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._buf = ""

    def feed(self, data: bytes, final: bool = False) -> list[tuple[str, bool]]:
        self._buf += self._decoder.decode(data, final)
        out: list[tuple[str, bool]] = []
        buf = self._buf
        start = 0
        i = 0
        n = len(buf)
        while i < n:
            ch = buf[i]
            if ch == "\n":
                out.append((buf[start:i], True))
                start = i + 1
            elif ch == "\r":
                if i + 1 < n:
                    if buf[i + 1] == "\n":
                        out.append((buf[start:i], True))
                        i += 1
                    else:
                        out.append((buf[start:i], False))
                    start = i + 1
                elif final:
                    out.append((buf[start:i], False))
                    start = i + 1
                else:
                    break   # a lone \r at the end: wait to see whether \n follows
            i += 1
        self._buf = buf[start:]
        if final and self._buf:
            out.append((self._buf, True))
            self._buf = ""
        return out

    @property
    def pending(self) -> str:
        return self._buf.rstrip("\r")


def split_text(text: str) -> list[tuple[str, bool]]:
    """Split a whole text at once (tests, fixtures)."""
    return Splitter().feed(text.encode("utf-8"), final=True)


# ---- following the log file --------------------------------------------------------------
class LogFollower:
    """Tail a log file in a thread; hand its segments to `on_segment`.

    Keeps the last `keep` display lines (a line redrawn with `\\r` shows its last state)
    for error reports. `drain()` reads everything written so far, synchronously: the
    supervisor calls it after the server exits so the classification sees the last lines.
    """

    def __init__(self, path: str, on_segment: Callable[[str, bool], None], *, keep: int = 400,
                 interval_s: float = 0.05, max_bytes: int = ROTATE_AT_BYTES) -> None:
        self.path = path
        self._on_segment = on_segment
        self._offset = 0
        self._splitter = Splitter()
        self._lines: deque[str] = deque(maxlen=keep)
        self._partial_line = ""
        self._peeked = ""
        self._interval = interval_s
        self._max_bytes = max_bytes
        self._lock = threading.RLock()       # callbacks may ask for tail() while we parse
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    @classmethod
    def resume(cls, path: str, on_segment: Callable[[str, bool], None], backlog: int = 40) -> "LogFollower":
        """Follow a log another process has been writing (an adopted server): parse only what
        comes next, but keep its last `backlog` lines for error reports."""
        follower = cls(path, on_segment)
        follower._lines.extend(read_tail(path, lines=backlog))
        try:
            follower._offset = os.path.getsize(path)
        except OSError:
            pass
        return follower

    def start(self) -> "LogFollower":
        self._thread = threading.Thread(target=self._run, name=f"vllm-omni-log:{os.path.basename(self.path)}",
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=2)
        self.drain()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                got = self.poll_once()
            except Exception:  # noqa: BLE001 - a parser bug must not kill log capture
                got = False
            if not got:
                self._stop.wait(self._interval)

    def drain(self) -> None:
        while self.poll_once():
            pass

    def poll_once(self) -> bool:
        """Read what is new; True when something was read."""
        with self._lock:
            try:
                size = os.path.getsize(self.path)
            except OSError:
                return False
            if size < self._offset:          # truncated by rotation: start over
                self._offset = 0
            if size == self._offset:
                return False
            with open(self.path, "rb") as fh:
                fh.seek(self._offset)
                data = fh.read(min(size - self._offset, 1024 * 1024))
            self._offset += len(data)
            for text, ends_line in self._splitter.feed(data):
                self._emit(text, ends_line)
            pending = clean(self._splitter.pending)
            peek = bar_text(pending) if pending else None
            if peek is not None and peek != self._peeked:
                # tqdm leaves its newest redraw unterminated until the next one: show it now.
                self._peeked = peek
                self._on_segment(peek, False)
            if self._offset > self._max_bytes and size == self._offset:
                self._rotate()
            return True

    def _emit(self, text: str, ends_line: bool) -> None:
        text = clean(text)
        if self._peeked:
            if bar_text(text) == self._peeked:
                rest = strip_prefix(text)[len(self._peeked):]
                self._peeked = ""
                if rest.strip():
                    self._on_segment(rest, ends_line)     # a log line glued after the redraw
            else:
                self._peeked = ""
                self._on_segment(text, ends_line)
        else:
            self._on_segment(text, ends_line)
        if ends_line:
            shown = text if text.strip() or not self._partial_line else self._partial_line
            self._lines.append(shown)
            self._partial_line = ""
        elif text.strip():
            self._partial_line = text

    def _rotate(self) -> None:
        """Copy-truncate a huge log: keep its last 16 MiB in `<log>.1` (0600, like the log:
        it holds the same prompts and paths), empty the file.

        The server appends with O_APPEND, so after the truncation it simply continues at
        offset 0 of the same file; everything up to now has already been parsed.
        """
        try:
            fd = private_files.open_private(self.path + ".1", private_files.REPLACE)
            with os.fdopen(fd, "wb") as dst, open(self.path, "rb") as src:
                src.seek(max(0, self._offset - ROTATED_KEEP_BYTES))
                dst.write(src.read(ROTATED_KEEP_BYTES))
            os.truncate(self.path, 0)
            self._offset = 0
        except OSError:
            pass

    def tail(self, lines: int = 40) -> list[str]:
        with self._lock:
            out = list(self._lines)
            if self._partial_line:
                out.append(self._partial_line)
        return out[-lines:]


def read_tail(path: str, max_bytes: int = 64 * 1024, lines: int = 40) -> list[str]:
    """The last display lines of a log file (for an adopted server or a post-mortem)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - max_bytes))
            data = fh.read()
    except OSError:
        return []
    out: list[str] = []
    partial = ""
    for text, ends_line in Splitter().feed(data, final=True):
        text = clean(text)
        if ends_line:
            out.append(text if text.strip() or not partial else partial)
            partial = ""
        elif text.strip():
            partial = text
    return out[-lines:]
