"""Read the server's log: startup phases and their progress, denoise progress, error lines.

vLLM-Omni has no HTTP loading state (the port refuses connections until the model is warm)
and no HTTP progress (a job's `progress` jumps 0 -> 100). Both exist only in its log: the
startup lines (in 0.30: "Delegating entrypoint handling to vllm-omni", "Detected diffusion
model", "Prefetching ... subfolders", "Multi-thread loading shards" bars, "Loading weights
took", "Model loading took X GiB", the warm-up "dummy run", then "Starting vLLM API server",
"Available routes are", uvicorn's "Application startup complete") and the rank-0 tqdm bar
of the denoise loop, which redraws itself with carriage returns
(`\\r 25%|██▌       | 1/4 [00:00<00:01,  1.56it/s]`). log_follower.py splits the file on
both `\\r` and `\\n`; every segment is offered to the parsers here. After a job's last
denoise step the server decodes, postprocesses and encodes for seconds, then logs that it
stored the MP4 ("Video request ID persisted KEY output file.") just before the job's status
turns completed: the client's fast-poll hint (client/poll_window.Hint) reads both.

The log is untrusted text: every segment is stripped of terminal escapes and control
characters (redact.strip_control) before it is parsed or shown.
"""
from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass, replace
from typing import Callable, Optional

from ...client.poll_window import Hint
from ...errors import failure_patterns
from ...errors.redact import strip_control

# ---- phases ---------------------------------------------------------------------------
STARTING, DOWNLOADING, LOADING, WARMUP, READY = "starting", "downloading", "loading", "warmup", "ready"
PHASE_ORDER = (STARTING, DOWNLOADING, LOADING, WARMUP, READY)

# (done, total or None, unit): what a progress bar for a startup phase needs.
Progress = tuple[float, Optional[float], str]

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

# A tqdm bar with a description ("Loading weights:  45%|...| 10/22 [...]",
# "Multi-thread loading shards:  50% Completed | 1/2 [...]", "Fetching 12 files:  ...",
# a Hugging Face byte bar "model.safetensors:  45%|...| 2.15G/4.77G [...]" or
# "Reconstructing ...:  45%|...|  2.1GB / 4.7GB").
_DESC_BAR = re.compile(r"^(?P<desc>[^|%]*?):\s+(?P<pct>\d+)%(?: Completed)?\s*\|[^|]*\|?\s*"
                       r"(?P<n>[\d.]+[kMGT]?B?)\s*/\s*(?P<total>[\d.]+[kMGT]?B?)")
_SIZE = re.compile(r"^(?P<num>[\d.]+)(?P<scale>[kMGT]?)(?P<b>B?)$")
_SCALE = {"": 1.0, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
# The denoise bar has no description: "  0%|          | 0/4 [00:00<?, ?it/s]".
_BAR = re.compile(r"^(?P<pct>\d{1,3})%\|[^|]*\|\s*(?P<n>\d+)/(?P<total>\d+)\s*"
                  r"\[(?P<elapsed>[\d:]+)<(?P<remaining>[\d:?]+),\s*(?P<rate>[\d.?]+)\s*(?P<unit>s/it|it/s)[^\]]*\]")
# The video API stored a job's MP4; the job's status turns completed right after (the same coroutine, no
# wait between: vLLM-Omni 0.30 entrypoints/openai/video/generation/helpers.py, 0.26 entrypoints/openai/
# api_server.py, `_run_video_generation_job`). The latest line before completion in both; searched, not
# matched, since it can follow a tqdm redraw in the same segment.
_STORED = re.compile(r"Video request \S{1,256} persisted \S{1,256} output file\.")


def clean(segment: str) -> str:
    """A log segment as text we may parse and show: no escape sequences or control characters."""
    return strip_control(segment)


def strip_prefix(segment: str) -> str:
    """Remove escapes, vLLM's `(APIServer pid=914) ` process tag and leading blanks."""
    return failure_patterns.strip_pid_prefix(clean(segment))


@dataclass(frozen=True)
class PhaseChange:
    phase: Optional[str]   # None: same phase, new text
    text: str
    progress: Optional[Progress] = None


def parse_phase(segment: str) -> Optional[PhaseChange]:
    """Map one log segment to a startup phase, a sentence for the status line and, for a
    download or loading bar, its progress."""
    line = strip_prefix(segment)
    for pattern, phase, template in _PHASE_LINES:
        m = pattern.search(line)
        if m:
            return PhaseChange(phase, template.format(*m.groups()))
    m = _DESC_BAR.match(line)
    if m:
        return _described_bar(m.group("desc").strip(), m.group("n"), m.group("total"))
    return None


def _described_bar(desc: str, n_text: str, total_text: str) -> Optional[PhaseChange]:
    n, total = _SIZE.match(n_text), _SIZE.match(total_text)
    if n is None or total is None:
        return None
    lower = desc.lower()
    if any(m.group("scale") or m.group("b") for m in (n, total)):      # a byte count: a download
        done_mb, total_mb = _bytes(n) / 1e6, _bytes(total) / 1e6
        return PhaseChange(DOWNLOADING, f"Downloading weights: {desc} {done_mb:.0f}/{total_mb:.0f} MB",
                           (round(done_mb, 1), round(total_mb, 1), "MB"))
    done, count = float(n.group("num")), float(total.group("num"))
    if lower.startswith(("fetching", "downloading")):
        return PhaseChange(DOWNLOADING, f"Downloading weights: {desc} {n_text}/{total_text}", (done, count, "files"))
    if "load" in lower or "shard" in lower:
        unit = "shards" if "shard" in lower else "parts"
        return PhaseChange(LOADING, f"{desc}: {n_text}/{total_text}", (done, count, unit))
    return None


def _bytes(m: re.Match[str]) -> float:
    return float(m.group("num")) * _SCALE[m.group("scale")]


def warmup_step(segment: str) -> Optional[PhaseChange]:
    """The warm-up's dummy denoise run as progress (call it only while warming up)."""
    bar = parse_bar(segment)
    if bar is None:
        return None
    return PhaseChange(WARMUP, f"Warming up: dummy generation step {bar.step}/{bar.total}",
                       (float(bar.step), float(bar.total), "steps"))


def server_version(segment: str) -> Optional[tuple[int, int]]:
    m = _VERSION.search(segment)
    return (int(m.group(1)), int(m.group(2))) if m else None


def is_oom_line(segment: str) -> bool:
    return failure_patterns.is_oom(segment)


def is_version_mismatch(segment: str) -> bool:
    return bool(failure_patterns.VERSION_MISMATCH.search(segment))


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
    stored: bool = False         # after it was done, the server logged storing a job's MP4

    @property
    def fraction(self) -> float:
        return self.step / self.total if self.total else 0.0

    def hint_after(self, run_floor: int) -> Hint:
        """The fast-poll hint (client/poll_window.Hint) for a job whose runs are newer than `run_floor`:
        STORED once the server logged storing the MP4 after this run (completion is next), DENOISED once
        the run reached its last step (VAE decode and MP4 encode follow), else NONE."""
        if self.run_id <= run_floor or not self.done:
            return Hint.NONE
        return Hint.STORED if self.stored else Hint.DENOISED


def fast_poll_hint(progress: Callable[[], Optional[DenoiseProgress]],
                   nudge: Optional[Callable[[], None]] = None) -> tuple[int, Callable[[], Hint]]:
    """For a job about to be submitted: the newest denoise run before it (`run_floor`: runs up to it are
    earlier jobs') and the client's `due` hint for it (client/poll_window.Hint), read from `progress`
    (the supervisor's tracker) each time the client asks. While the hint is DENOISED, each ask also
    `nudge`s the log's reader (the stored line is next: read at the client's pace, not the follower's
    interval). The node and the CLI both take it from here."""
    last = progress()
    floor = last.run_id if last is not None else -1

    def due() -> Hint:
        now = progress()
        hint = now.hint_after(floor) if now is not None else Hint.NONE
        if hint == Hint.DENOISED and nudge is not None:
            nudge()
        return hint
    return floor, due


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
        self._last_seen = 0.0   # last time a job bar or stored line was seen (activity for keep-alive)

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
        """Offer one log segment; True when it updated job progress (a bar, or the MP4 stored after a run).
        The bar is read first: a stored line glued after a new run's first redraw is an earlier run's."""
        line = strip_prefix(segment)
        with self._lock:
            changed = self._feed_bar(line)
            return (_STORED.search(line) is not None and self._mark_stored()) or changed

    def _feed_bar(self, line: str) -> bool:
        """The denoise bar (and the lines that tell warm-up from jobs) in `line`; the caller holds the lock."""
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

    def _mark_stored(self) -> bool:
        """The server stored a job's MP4: the finished run's job completes next. Only a run that reached
        its last step takes it, once (a repeated line changes nothing); the caller holds the lock."""
        cur = self._current
        if cur is None or not cur.done or cur.stored:
            return False
        self._current = replace(cur, stored=True)
        self._last_seen = self._clock()
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
