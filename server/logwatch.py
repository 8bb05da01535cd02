"""Read the server's log as it is written: startup phases, denoise progress, error lines.

vLLM-Omni has no HTTP loading state (the port refuses connections until the model is warm)
and no HTTP progress (a job's `progress` jumps 0 -> 100). Both exist only in its log: the
startup lines (vllm-omni-serving.md 4.6) and the rank-0 tqdm bar of the denoise loop, which
redraws itself with carriage returns (`\\r 25%|██▌       | 1/4 [00:00<00:01,  1.56it/s]`).
So the log is split on both `\\r` and `\\n`, and every segment is offered to the parsers.

The server writes straight into a file (not a pipe): a pipe would block the server once
our reader lags 64 KiB behind, and it would break (EPIPE) the moment ComfyUI exits, while a
file keeps working and lets a restarted ComfyUI adopt the server and keep reading it.
"""
from __future__ import annotations

import codecs
import os
import re
import threading
import time
from collections import deque
from dataclasses import dataclass, replace
from typing import Callable, Iterable, Optional

# ---- phases ---------------------------------------------------------------------------
STARTING, DOWNLOADING, LOADING, WARMUP, READY = "starting", "downloading", "loading", "warmup", "ready"
PHASE_ORDER = (STARTING, DOWNLOADING, LOADING, WARMUP, READY)

_PREFIX = re.compile(r"^\s*(?:\([A-Za-z_]+ pid=\d+\)\s*)?")
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")   # vLLM colours its "(APIServer pid=N)" tag

# (regex, phase or None (text only), text template using match groups)
_PHASE_LINES: tuple[tuple[re.Pattern[str], Optional[str], str], ...] = (
    (re.compile(r"Delegating entrypoint handling to vllm-omni"), STARTING, "Starting vLLM-Omni"),
    (re.compile(r"Detected diffusion model: (\S+)"), STARTING, "Starting vLLM-Omni for {0}"),
    (re.compile(r"Initializing with model (\S+)"), STARTING, "Initializing the engine for {0}"),
    (re.compile(r"Prefetching\b.*"), DOWNLOADING, "Downloading weights (the first start of a model fetches "
                                                  "all of it; A14B is over 100 GB)"),
    (re.compile(r"Downloading (?:shards|weights|model)\b.*"), DOWNLOADING, "Downloading weights"),
    (re.compile(r"Prefetch complete"), LOADING, "Download complete; loading weights"),
    (re.compile(r"Starting server\.\.\.|Launching Orchestrator|Initialized device and distributed environment"),
     LOADING, "Starting GPU workers"),
    (re.compile(r"Loading weights took ([\d.]+) seconds"), LOADING, "Weights read in {0} s"),
    (re.compile(r"Model loading took ([\d.]+) GiB and ([\d.]+) seconds"), LOADING,
     "Model loaded ({0} GiB in {1} s)"),
    (re.compile(r"Regional compilation applied|lazy regional torch\.compile"), WARMUP,
     "Model loaded; torch.compile is on, so the warm-up compiles kernels (minutes)"),
    (re.compile(r"dummy run to warm up the model"), WARMUP, "Warming up (one short dummy generation)"),
    (re.compile(r"Starting vLLM API server|Available routes are|Application startup complete"), None,
     "Warm-up done; HTTP server starting"),
)
_SERVER_UP = re.compile(r"Starting vLLM API server|Available routes are|Application startup complete")
_WARMUP_START = re.compile(r"dummy run to warm up the model")
_VERSION = re.compile(r"vLLM server version (\d+)\.(\d+)")
_VERSION_MISMATCH = re.compile(r"mismatched major/minor versions")
_OOM = re.compile(r"CUDA out of memory|OutOfMemoryError|torch\.cuda\.OutOfMemoryError")

# A tqdm bar with a description ("Loading weights:  45%|...| 10/22 [...]",
# "Multi-thread loading shards:  50% Completed | 1/2 [...]", "Fetching 12 files:  ...").
_DESC_BAR = re.compile(r"^(?P<desc>[^|%]*?):\s+(?P<pct>\d+)%(?: Completed)?\s*\|[^|]*\|?\s*"
                       r"(?P<n>[\d.]+[kMGT]?B?)/(?P<total>[\d.]+[kMGT]?B?)")
# The denoise bar has no description: "  0%|          | 0/4 [00:00<?, ?it/s]".
_BAR = re.compile(r"^(?P<pct>\d{1,3})%\|[^|]*\|\s*(?P<n>\d+)/(?P<total>\d+)\s*"
                  r"\[(?P<elapsed>[\d:]+)<(?P<remaining>[\d:?]+),\s*(?P<rate>[\d.?]+)\s*(?P<unit>s/it|it/s)[^\]]*\]")


def strip_ansi(text: str) -> str:
    return _ANSI.sub("", text) if "\x1b" in text else text


def strip_prefix(segment: str) -> str:
    """Remove colour codes, vLLM's `(APIServer pid=914) ` process tag and leading blanks."""
    return _PREFIX.sub("", strip_ansi(segment), count=1)


@dataclass(frozen=True)
class PhaseChange:
    phase: Optional[str]   # None: same phase, new text
    text: str


def parse_phase(segment: str) -> Optional[PhaseChange]:
    """Map one log segment to a startup phase and a sentence for the status line."""
    line = strip_prefix(segment)
    for pattern, phase, template in _PHASE_LINES:
        m = pattern.search(line)
        if m:
            return PhaseChange(phase, template.format(*m.groups()))
    m = _DESC_BAR.match(line)
    if m:
        desc = m.group("desc").strip()
        n, total = m.group("n"), m.group("total")
        if desc.lower().startswith(("fetching", "downloading")) or total.endswith("B"):
            return PhaseChange(DOWNLOADING, f"Downloading weights: {desc} {n}/{total}")
        if "load" in desc.lower() or "shard" in desc.lower():
            return PhaseChange(LOADING, f"Loading weights: {desc} {n}/{total}")
    return None


def server_version(segment: str) -> Optional[tuple[int, int]]:
    m = _VERSION.search(segment)
    return (int(m.group(1)), int(m.group(2))) if m else None


def is_oom_line(segment: str) -> bool:
    return bool(_OOM.search(segment))


def is_version_mismatch(segment: str) -> bool:
    return bool(_VERSION_MISMATCH.search(segment))


def is_server_up(segment: str) -> bool:
    return bool(_SERVER_UP.search(segment))


# ---- denoise progress -----------------------------------------------------------------
@dataclass(frozen=True)
class Bar:
    """One parsed tqdm redraw of the denoise loop."""

    step: int
    total: int
    seconds_per_step: Optional[float]
    remaining_s: Optional[float]


def _clock_s(text: str) -> Optional[float]:
    if "?" in text:
        return None
    seconds = 0.0
    for part in text.split(":"):
        seconds = seconds * 60 + float(part)
    return seconds


def bar_text(segment: str) -> Optional[str]:
    """The denoise redraw at the start of a segment (log lines from other threads can be
    glued right after it, since tqdm ends a redraw with no newline)."""
    m = _BAR.match(strip_prefix(segment))
    return m.group(0) if m else None


def parse_bar(segment: str) -> Optional[Bar]:
    """Parse a denoise progress redraw; None for anything else (including described bars)."""
    m = _BAR.match(strip_prefix(segment))
    if not m:
        return None
    rate_text, unit = m.group("rate"), m.group("unit")
    sps: Optional[float] = None
    if rate_text != "?":
        rate = float(rate_text)
        if rate > 0:
            sps = rate if unit == "s/it" else 1.0 / rate
    return Bar(int(m.group("n")), int(m.group("total")), sps, _clock_s(m.group("remaining")))


@dataclass(frozen=True)
class DenoiseProgress:
    """Where the current (or last) job's denoise loop is; what a progress bar needs.

    `run_id` grows by one for every denoise run the server starts (a bar restarting at
    0/N) and never resets while this supervisor lives, so a node can tell its own job's run
    from an earlier one. `eta_s` counts down from the last redraw.
    """

    run_id: int
    step: int
    total: int
    seconds_per_step: Optional[float]
    eta_s: Optional[float]
    updated_at: float            # time.time() of the last redraw
    started_at: float
    done: bool = False           # reached total
    aborted: bool = False        # ended by an error (e.g. out of memory) or a restart

    @property
    def fraction(self) -> float:
        return self.step / self.total if self.total else 0.0


class ProgressTracker:
    """Turns bar redraws into per-run progress records; skips the warm-up dummy run.

    Before the server is ready, bars belong to the startup warm-up (a 1-2 step dummy
    generation) and are not jobs. A bar counts as a job once the log said the HTTP server
    is up, or the supervisor saw /health answer, and no warm-up run is in flight.
    """

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._lock = threading.Lock()
        self._clock = clock
        self._next_run = 1
        self._current: Optional[DenoiseProgress] = None
        self._server_up = False
        self._in_warmup = False
        self._last_seen = 0.0   # last time a job bar was seen (activity for keep-alive)

    # lifecycle hooks ---------------------------------------------------------------
    def new_launch(self) -> None:
        """A new server process: its first bars are warm-up again. Run ids keep counting."""
        with self._lock:
            if self._current is not None and not self._current.done:
                self._current = replace(self._current, aborted=True, eta_s=None)
            self._server_up = False
            self._in_warmup = False

    def mark_server_up(self) -> None:
        with self._lock:
            self._server_up = True

    def abort_current(self) -> None:
        with self._lock:
            if self._current is not None and not self._current.done:
                self._current = replace(self._current, aborted=True, eta_s=None)

    # parsing -------------------------------------------------------------------------
    def feed(self, segment: str) -> bool:
        """Offer one log segment; True when it updated job progress."""
        line = strip_prefix(segment)
        with self._lock:
            if _WARMUP_START.search(line):
                self._in_warmup = True
                return False
            if _SERVER_UP.search(line):
                self._server_up = True
                self._in_warmup = False
                return False
            bar = parse_bar(line)
            if bar is None:
                return False
            if self._in_warmup or not self._server_up:
                if bar.total and bar.step >= bar.total:
                    self._in_warmup = False
                return False
            now = self._clock()
            cur = self._current
            # A new run: another total, a step going back, or 0/N after progress. A second 0/N
            # while the run is still at 0/N is the same redraw seen twice (early, unterminated,
            # then complete).
            new_run = (cur is None or bar.total != cur.total or bar.step < cur.step
                       or (bar.step == 0 and cur.step > 0))
            if not new_run and cur is not None and (cur.done or cur.aborted):
                # tqdm's closing redraw of a finished run, or a cancelled/failed run that the
                # GPU is still finishing (upstream cannot interrupt a Wan denoise)
                return False
            if new_run:
                run_id = self._next_run
                self._next_run += 1
                started = now
            else:
                run_id, started = cur.run_id, cur.started_at
            eta = None
            if bar.seconds_per_step is not None:
                eta = max(0, bar.total - bar.step) * bar.seconds_per_step
            elif bar.remaining_s is not None:
                eta = bar.remaining_s
            done = bar.total > 0 and bar.step >= bar.total
            self._current = DenoiseProgress(run_id, bar.step, bar.total, bar.seconds_per_step,
                                            0.0 if done else eta, now, started, done=done)
            self._last_seen = now
            return True

    def current(self) -> Optional[DenoiseProgress]:
        with self._lock:
            cur = self._current
        if cur is None or cur.eta_s is None or cur.done:
            return cur
        return replace(cur, eta_s=max(0.0, cur.eta_s - (self._clock() - cur.updated_at)))

    @property
    def last_seen(self) -> float:
        with self._lock:
            return self._last_seen


# ---- splitting a byte stream into \r / \n segments ---------------------------------------
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
    """Tail a log file from an offset in a thread; hand segments to `on_segment`.

    Keeps the last `keep` display lines (a line redrawn with `\\r` shows its last state)
    for error reports. `drain()` reads everything written so far, synchronously: the
    supervisor calls it after the server exits so the classification sees the last lines.
    """

    def __init__(self, path: str, on_segment: Callable[[str, bool], None], *, offset: int = 0,
                 keep: int = 400, interval_s: float = 0.05, max_bytes: int = 256 * 1024 * 1024) -> None:
        self.path = path
        self._on_segment = on_segment
        self._offset = offset
        self._splitter = Splitter()
        self._lines: deque[str] = deque(maxlen=keep)
        self._partial_line = ""
        self._peeked = ""
        self._interval = interval_s
        self._max_bytes = max_bytes
        self._lock = threading.RLock()       # callbacks may ask for tail() while we parse
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

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
            pending = strip_ansi(self._splitter.pending)
            peek = bar_text(pending) if pending else None
            if peek is not None and peek != self._peeked:
                # tqdm leaves its newest redraw unterminated until the next one: show it now.
                self._peeked = peek
                self._on_segment(peek, False)
            if self._offset > self._max_bytes and size == self._offset:
                self._rotate()
            return True

    def _emit(self, text: str, ends_line: bool) -> None:
        text = strip_ansi(text)
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
        """Copy-truncate a huge log: keep its last 16 MiB in `<log>.1`, empty the file.

        The server appends with O_APPEND, so after the truncation it simply continues at
        offset 0 of the same file; everything up to now has already been parsed.
        """
        keep = 16 * 1024 * 1024
        try:
            with open(self.path, "rb") as src, open(self.path + ".1", "wb") as dst:
                src.seek(max(0, self._offset - keep))
                dst.write(src.read(keep))
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

    @property
    def offset(self) -> int:
        return self._offset


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
        text = strip_ansi(text)
        if ends_line:
            out.append(text if text.strip() or not partial else partial)
            partial = ""
        elif text.strip():
            partial = text
    return out[-lines:]


def iter_segments(lines: Iterable[str]) -> Iterable[str]:
    for line in lines:
        for text, _ in split_text(line):
            yield text
