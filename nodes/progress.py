"""The one place that turns supervisor and client events into ComfyUI progress and text.

A waiting node reports through one `NodeReporter`: a bar and a status line, each sent only when it
changes (a 0.25 s poll must not become three websocket messages). Each run replaces the last run's
text, and a failure replaces it with what went wrong. The bar goes through ComfyUI's V3 progress API,
which never raises ComfyUI's interrupt into our threads; `cancel_requested()` reads the Cancel flag.
The HTTP API has no job progress: a supervised server's bar shows the denoise steps and ETA its log
gives; a remote one's, elapsed time against what jobs of the kind took there (client/poll_window.py),
growing past it rather than sitting at "~0s left", or with elapsed time alone for the first such job,
whose text says so (client/progress_estimate.py).
"""
from __future__ import annotations

import threading
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional

from ..client.progress_estimate import elapsed_fraction, estimated_fraction
from ..errors import LauncherError
from . import comfy_bridge

REMOTE_BAR = 100                                        # remote bar in percent: no real steps to show
QUEUED_QUIET_S = 5.0                                    # queued longer than this: not just the server's pickup


# ----------------------------------------------------------------------------- the reporter
class NodeReporter:
    """One node's progress bar and status line, deduplicated, safe from any thread."""

    def __init__(self, node_id: Optional[str]) -> None:
        self.node_id = node_id
        self._lock = threading.Lock()
        self._text: Optional[str] = None
        self._position: Optional[tuple[int, int]] = None
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
            comfy_bridge.set_progress(*position, self.node_id)

    def cancel_requested(self) -> bool:
        """Has the user pressed Cancel? (ComfyUI's flag, read without clearing it.)"""
        return comfy_bridge.interrupted()

    def close(self) -> None:
        """The node has returned: no more bar updates. No server event reaches this reporter afterwards either:
        its launch's status listener ends with the launch (session.launch_local unlistens it)."""
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
    remote_estimate_s: Optional[float] = None            # what this kind of job took there before

    def on_update(self, update: Any) -> None:
        status = update.status
        if status == "queued":
            self.reporter.text(f"Queued {clock(update.queued_s)} ({self._why_queued(update.queued_s)})")
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

    def _why_queued(self, queued_s: float) -> str:
        """Busy only where it is known: a supervised server's log shows an earlier job still denoising.
        An idle server starts a job within a poll or two, so a short wait says nothing; a long one on a
        server whose log we do not read (remote) is most likely another client's job."""
        progress = self.local_progress() if self.local_progress is not None else None
        if progress is not None and progress.run_id <= self.run_floor and not (progress.done or progress.aborted):
            return f"the server is busy with another job, at step {progress.step}/{progress.total}"
        if queued_s < QUEUED_QUIET_S:
            return "waiting for the server to start it"
        return "the server has not started it yet: it may be busy with another job"

    def _local(self, running_s: float) -> None:
        progress = self.local_progress() if self.local_progress is not None else None
        if progress is None or progress.run_id <= self.run_floor or not progress.total:
            self.reporter.text(f"Running {clock(running_s)} (loading the job; no denoise step yet)")
            return
        self.reporter.bar(progress.step, progress.total)
        if progress.step >= progress.total:
            self.reporter.text(f"Decoding the video ({clock(running_s)} since the job started)")
        else:
            eta = f", ETA {clock(progress.eta_s)}" if progress.eta_s is not None else ""
            self.reporter.text(f"Step {progress.step}/{progress.total}, {clock(running_s)} elapsed{eta}")

    def finish(self) -> None:
        """The job is done: fill the bar (the last poll may have come before the last step)."""
        if self.local_progress is not None:
            self.reporter.bar(self.steps, self.steps)
        else:
            self.reporter.bar(REMOTE_BAR, REMOTE_BAR)
