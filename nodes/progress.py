"""The one place that turns supervisor and client events into ComfyUI progress and text.

Every node that waits reports through a `NodeReporter`: one progress bar and one status
line under the node, each sent only when it changes (a poll every 0.25 s must not become
three websocket messages every 0.25 s). The front end keeps a node's last text until a new
one arrives and ignores empty text, so each run starts by replacing it and a failure
replaces it with what went wrong: the previous run's "Done: ..." never lingers.

ComfyUI's ProgressBar doubles as its Cancel check: an update while Cancel is pending
clears the flag and raises. The reporter never lets that escape into a supervisor or client
callback (where it would be swallowed or kill a thread); it remembers the cancel instead,
and `cancel_requested()` is what the launch and the job poll, so a cancel is never lost.

Job progress: the HTTP API has none (0 then 100). For a server we supervise, the
supervisor parses the rank-0 tqdm lines of its log, so the bar shows real denoise steps and
their ETA. For a remote server only elapsed time is known: it is compared with how long
similar jobs took on that server, and once a job runs longer than that the estimate grows
with it instead of sitting at "~0s left". The first job of its size on a server has no
estimate yet: its bar moves with the time elapsed (half-way at ELAPSED_HALF_S, never full),
and its text says that the bar is elapsed time, so the node shows it is alive.
"""
from __future__ import annotations

import threading
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional

from ..errors import LauncherError
from . import comfy_bridge

_lock = threading.Lock()
_seconds_per_unit: dict[tuple[str, str], float] = {}   # (url, family) -> running seconds per (token x step)
REMOTE_BAR = 100                                        # remote bar in percent: no real steps to show
ELAPSED_HALF_S = 60.0                                   # without an estimate, the bar is half-way after this


# ----------------------------------------------------------------------------- the reporter
class NodeReporter:
    """One node's progress bar and status line, deduplicated, safe from any thread."""

    def __init__(self, node_id: Optional[str]) -> None:
        self.node_id = node_id
        self._lock = threading.Lock()
        self._text: Optional[str] = None
        self._position: Optional[tuple[int, int]] = None
        self._bar: Any = None
        self._cancelled = False
        self._closed = False

    def text(self, text: str) -> None:
        """Show `text` under the node unless it is already shown."""
        text = text.strip() or "…"       # the front end ignores empty text
        with self._lock:                 # sent under the lock: texts from two threads keep their order
            if text == self._text:
                return
            self._text = text
            comfy_bridge.send_status(text, self.node_id)

    def bar(self, value: float, total: float) -> None:
        """Move the progress bar (while the node runs; later callbacks only update the text)."""
        if total <= 0:
            return
        position = (int(min(max(value, 0), total)), int(total))
        with self._lock:
            if self._closed or position == self._position:
                return
            self._position = position
            if comfy_bridge.interrupted():
                self._cancelled = True       # an update now would clear ComfyUI's Cancel flag
                return
            if self._bar is None:
                self._bar = comfy_bridge.progress_bar(position[1], self.node_id)
            try:
                self._bar.update_absolute(*position)
            except Exception as exc:         # ComfyUI raises its interrupt from here
                if not comfy_bridge.is_interrupt_exception(exc):
                    raise
                self._cancelled = True

    def cancel_requested(self) -> bool:
        """Has the user pressed Cancel (seen by ComfyUI's flag or by a bar update)?"""
        return self._cancelled or comfy_bridge.interrupted()

    def close(self) -> None:
        """The node has returned: no more bar updates (text from later server events is still shown)."""
        with self._lock:
            self._closed = True

    # -- supervisor events -----------------------------------------------------------------
    def launch_status(self, status: Any) -> None:
        """A supervisor Status: its text, and the bar where the phase's progress is known."""
        text = status.text
        progress = status.progress
        if progress is not None:
            done, total, unit = progress
            amount = f"{done:,.0f}/{total:,.0f} {unit}" if total else f"{done:,.0f} {unit}"
            if amount not in text:
                text = f"{text} ({amount})"
            if total:
                self.bar(done, total)
        if status.fallback_note:
            text += f"\n{status.fallback_note}"
        self.text(text)


@contextmanager
def reporting(node_id: Optional[str], first_text: str) -> Iterator[NodeReporter]:
    """Run a node's work with a reporter: the first text replaces the last run's, a failure
    replaces it with what went wrong, and the bar stops when the node returns."""
    reporter = NodeReporter(node_id)
    reporter.text(first_text)
    try:
        yield reporter
    except LauncherError as err:
        reporter.text(f"Failed: {err.what}")
        raise
    finally:
        reporter.close()


# ----------------------------------------------------------------------------- remote estimates
def work_units(width: int, height: int, frames: int, steps: int) -> float:
    """Job size proxy: latent tokens x denoise steps."""
    return (width / 16) * (height / 16) * ((frames - 1) // 4 + 1) * max(1, steps)


def learn(url: str, family: str, units: float, running_s: float) -> None:
    """Remember how long a job of this size ran on this server (moving average)."""
    if units > 0 and running_s > 0:
        with _lock:
            old = _seconds_per_unit.get((url, family))
            new = running_s / units
            _seconds_per_unit[(url, family)] = new if old is None else 0.5 * old + 0.5 * new


def estimate(url: str, family: str, units: float) -> Optional[float]:
    """Seconds a job of this size should run on this server, from earlier jobs here (None: no job yet)."""
    with _lock:
        rate = _seconds_per_unit.get((url, family))
    return rate * units if rate is not None else None


REMOTE_DUE_SHARE = 0.9     # a remote job is "due" (poll fast) from this share of its estimate on


def remote_due(running_s: float, estimate_s: Optional[float]) -> bool:
    """Has a remote job run long enough that it should be finishing (from earlier jobs there)?"""
    return bool(estimate_s) and running_s >= REMOTE_DUE_SHARE * float(estimate_s)


def estimated_fraction(running_s: float, estimate_s: float) -> float:
    """Share of the job done: linear up to 80 % of the estimate, then growing towards (never
    reaching) 1, starting with the same slope: an overrunning job still moves and never looks
    done, as if the estimate kept growing with the time it has run."""
    knee = 0.8 * estimate_s
    if running_s <= knee:
        return running_s / estimate_s
    tail = estimate_s - knee
    return 1.0 - 0.2 * tail / (tail + running_s - knee)


def elapsed_fraction(running_s: float) -> float:
    """The bar of a job with no estimate: it moves with the time elapsed and is never full."""
    running_s = max(0.0, running_s)
    return running_s / (running_s + ELAPSED_HALF_S)


def clock(seconds: float) -> str:
    seconds = int(max(0, seconds))
    return f"{seconds // 60}:{seconds % 60:02d}" if seconds >= 60 else f"{seconds}s"


# ----------------------------------------------------------------------------- job progress
@dataclass
class JobProgress:
    """Turns the client's poll updates into the bar and the status line."""

    reporter: NodeReporter
    steps: int
    local_progress: Optional[Callable[[], Any]] = None   # Supervisor.progress
    run_floor: int = -1                                  # denoise runs up to this id belong to earlier jobs
    remote_estimate_s: Optional[float] = None

    running_s: float = 0.0                               # as of the last poll

    def due(self) -> bool:
        """Should the job be finishing now (so the client polls faster)? Local: the log showed
        this job's last denoise step. Remote: it ran 90% of the learned estimate."""
        if self.local_progress is not None:
            progress = self.local_progress()
            return progress is not None and progress.denoised_after(self.run_floor)
        return remote_due(self.running_s, self.remote_estimate_s)

    def on_update(self, update: Any) -> None:
        self.running_s = update.running_s
        status = update.status
        if status == "queued":
            self.reporter.text(f"Queued {clock(update.queued_s)} (the server is busy with another job)")
            return
        if status != "in_progress":
            return
        running = clock(update.running_s)
        if self.local_progress is not None:
            self._local(update.running_s)
            return
        estimate_s = self.remote_estimate_s
        if not estimate_s:
            self.reporter.bar(elapsed_fraction(update.running_s) * REMOTE_BAR, REMOTE_BAR)
            self.reporter.text(f"Running {running} (first job of this size on this server: no estimate yet, "
                               "so the bar shows time elapsed)")
            return
        self.reporter.bar(estimated_fraction(update.running_s, estimate_s) * REMOTE_BAR, REMOTE_BAR)
        if update.running_s < estimate_s:
            self.reporter.text(f"Running {running}, ~{clock(estimate_s - update.running_s)} left "
                               f"(estimated from earlier jobs on this server)")
        else:
            self.reporter.text(f"Running {running}: longer than the ~{clock(estimate_s)} earlier jobs took "
                               "here, so no time left can be estimated")

    def _local(self, running_s: float) -> None:
        progress = self.local_progress() if self.local_progress is not None else None
        if progress is None or progress.run_id <= self.run_floor or not progress.total:
            self.reporter.text(f"Running {clock(running_s)} (loading the job; no denoise step yet)")
            return
        self.reporter.bar(progress.step, progress.total)
        if progress.step >= progress.total:
            self.reporter.text(f"Decoding the video (denoise done in {clock(running_s)})")
        else:
            eta = f", ETA {clock(progress.eta_s)}" if progress.eta_s is not None else ""
            self.reporter.text(f"Step {progress.step}/{progress.total}, {clock(running_s)} elapsed{eta}")

    def finish(self) -> None:
        """The job is done: fill the bar (the last poll may have come before the last step)."""
        if self.local_progress is not None:
            self.reporter.bar(self.steps, self.steps)
        else:
            self.reporter.bar(REMOTE_BAR, REMOTE_BAR)
