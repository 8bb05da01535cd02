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
import re
import threading
from collections import deque
from typing import Callable, Optional

from ..storage import private_files
from .logwatch import bar_text, clean, strip_prefix

ROTATE_AT_BYTES = 256 * 1024 * 1024
ROTATED_KEEP_BYTES = 16 * 1024 * 1024
READ_CHUNK_BYTES = 1024 * 1024
MAX_SEGMENT_CHARS = 16 * 1024         # a longer line keeps this head; the rest is counted, not kept
_BREAK = re.compile(r"\r\n|\r|\n")


class Splitter:
    """Incremental UTF-8 decode and split on `\\r`, `\\n` and `\\r\\n`, in linear work.

    `feed` returns complete segments as (text, ends_line); the unfinished tail is kept and
    exposed by `pending` so a bar drawn without its trailing `\\r` yet can be read early.

    Each character is looked at once (`scanned` counts them): the breaks are found by one regex
    pass over the new text only, never over what an unfinished line already holds. A segment
    keeps at most `max_chars` of its head; the rest is counted and said at its end (`cut_chars`
    in all), so one endless line (32 MiB took 34 s of CPU when the tail was rescanned per read)
    costs its length once and a bounded amount of memory.
    """

    def __init__(self, max_chars: int = MAX_SEGMENT_CHARS) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._max = max_chars
        self._head = ""          # the unfinished segment's head (at most max_chars)
        self._dropped = 0        # characters of the unfinished segment past its head
        self._cr = False         # the last text ended with a lone \r: a \n may follow
        self.scanned = 0
        self.cut_chars = 0

    def feed(self, data: bytes, final: bool = False) -> list[tuple[str, bool]]:
        text = self._decoder.decode(data, final)
        self.scanned += len(text)
        if self._cr:
            text, self._cr = "\r" + text, False
        if text.endswith("\r") and not final:
            text, self._cr = text[:-1], True
        out: list[tuple[str, bool]] = []
        pos = 0
        for m in _BREAK.finditer(text):
            self._add(text, pos, m.start())
            out.append((self._take(), m.group() != "\r"))
            pos = m.end()
        self._add(text, pos, len(text))
        if final and (self._head or self._dropped):
            out.append((self._take(), True))
        return out

    def _add(self, text: str, start: int, end: int) -> None:
        room = self._max - len(self._head)
        if end - start > room:
            self._dropped += end - start - max(room, 0)
            end = start + max(room, 0)
        if end > start:
            self._head += text[start:end]

    def _take(self) -> str:
        text, dropped = self._head, self._dropped
        self._head, self._dropped = "", 0
        if dropped:
            self.cut_chars += dropped
            text += f" [... {dropped} more characters of this line cut by vllm-omni-launcher]"
        return text

    @property
    def pending(self) -> str:
        return self._head


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
        self.skipped_bytes = 0
        self._lock = threading.RLock()       # callbacks may ask for tail() while we parse
        self._stop = threading.Event()
        self._wake = threading.Event()        # stop() or nudge(): read now, not after the interval
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

    def nudge(self) -> None:
        """Read again now rather than at the next interval: a client waiting for a line that is due (the
        MP4's "persisted" line after the last denoise step) asks each time it looks, so the line reaches
        it within its own short pace while the follower keeps its interval otherwise."""
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
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
                self._wake.wait(self._interval)
                self._wake.clear()

    def drain(self) -> None:
        while self.poll_once():
            pass

    def poll_once(self) -> bool:
        """Read what is new (at most READ_CHUNK_BYTES); True when something was read."""
        with self._lock:
            try:
                with private_files.open_read(self.path) as fh:      # never through a link
                    size = os.fstat(fh.fileno()).st_size
                    if size < self._offset:          # truncated by a rotation: start over
                        self._offset = 0
                    if size == self._offset:
                        return False
                    fh.seek(self._offset)
                    data = fh.read(min(size - self._offset, READ_CHUNK_BYTES))
            except OSError:
                return False
            self._offset += len(data)
            for text, ends_line in self._splitter.feed(data):
                self._emit(text, ends_line)
            pending = clean(self._splitter.pending)
            peek = bar_text(pending) if pending else None
            if peek is not None and peek != self._peeked:
                # tqdm leaves its newest redraw unterminated until the next one: show it now.
                self._peeked = peek
                self._on_segment(peek, False)
            if size > self._max_bytes:
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
        """Copy-truncate a huge log: keep its last ROTATED_KEEP_BYTES in `<log>.1` (0600, like
        the log: it holds the same prompts and paths), empty the file.

        It runs on every read that finds the file past `max_bytes`, caught up or not, so a
        server that writes faster than we parse (a flood) cannot grow the file past the bound
        by more than it writes between two reads: what we had not parsed yet is skipped (and
        counted, `skipped_bytes`, and said in the tail). The server appends with O_APPEND, so
        after the truncation it continues at offset 0 of the same file. The few bytes it writes
        between the copy and the truncation are lost: the price of rotating a file another
        process holds open. The truncation happens even when the copy cannot be made (a full
        disk, a link planted at `<log>.1`): the bound matters more than the copy.
        """
        try:
            with private_files.open_read(self.path) as src:
                end = os.fstat(src.fileno()).st_size
                fd = private_files.open_private(self.path + ".1", private_files.REPLACE)
                with os.fdopen(fd, "wb") as dst:
                    src.seek(max(0, end - ROTATED_KEEP_BYTES))
                    dst.write(src.read(ROTATED_KEEP_BYTES))
        except OSError:
            end = None
        try:
            if end is None:
                end = os.path.getsize(self.path)
            os.truncate(self.path, 0)
        except OSError:
            return
        if end > self._offset:
            self.skipped_bytes += end - self._offset
            self._lines.append(f"[vllm-omni-launcher: {end - self._offset} bytes of server output skipped: the log "
                               "grew faster than it could be read; the last part is in the rotated .1 file]")
        self._offset = 0

    def tail(self, lines: int = 40) -> list[str]:
        with self._lock:
            out = list(self._lines)
            if self._partial_line:
                out.append(self._partial_line)
        return out[-lines:]


def read_tail(path: str, max_bytes: int = 64 * 1024, lines: int = 40) -> list[str]:
    """The last display lines of a log file (for an adopted server or a post-mortem)."""
    try:
        with private_files.open_read(path) as fh:
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
