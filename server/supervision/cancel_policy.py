"""Cancel that weighs its cost: let a cancelled Wan denoise drain, or restart the server.

Upstream's DELETE removes a job record but cannot stop a Wan denoise that has started: the
GPU stays busy until the loop ends. A restart frees it sooner, but the server is then gone
for as long as it takes to start again. So the choice is a comparison of two waits:

* drain: the GPU is free (and the server can take the next job) when the denoise ends, in
  about `remaining_s` = steps left x seconds per step, from the live tqdm bar. A step that
  is taking longer than the bar's rate (a stall, or the first step, whose rate tqdm does
  not know yet) counts with the time it has taken so far: a lower bound that grows, so a
  hung job soon costs more than a restart.
* restart: the grace still left (the job may end by itself meanwhile), then this server's
  own measured restart time: its last launch-to-ready, downloads excluded.

Restart only when draining would take longer than the restart by a margin
(`ratio` x restart + `slack_s`): a restart loses the warm server, so a near tie drains. A
queued job never reached the GPU and needs nothing. Without a measured restart time (an
adopted server) the costs cannot be weighed, and the policy keeps the older rule: restart
when the job still runs after the grace.

Pure: no clock, no I/O. The cancel watch (cancel_watch.py) feeds it the progress snapshot, the
time and its measurement, and acts on the decision; the node shows `text`.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Optional

from ..logs.logwatch import DenoiseProgress

DRAIN, RESTART, NOTHING = "drain", "restart", "nothing"


@dataclass(frozen=True)
class CancelDecision:
    """What to do with the GPU work of a cancelled job, with the numbers behind it."""

    action: str                        # DRAIN | RESTART | NOTHING
    remaining_s: Optional[float]       # GPU time the job would still take (None: not running)
    restart_s: Optional[float]         # this server's measured restart time (None: not measured)
    grace_left_s: float
    text: str                          # one sentence for the node, the status line and the log

    @property
    def restart(self) -> bool:
        return self.action == RESTART


@dataclass(frozen=True)
class CancelPolicy:
    """Restart when remaining_s > grace left + ratio x restart_s + slack_s."""

    grace_s: float = 15.0
    ratio: float = 1.2
    slack_s: float = 5.0

    def remaining_s(self, progress: DenoiseProgress, now: float) -> float:
        """Seconds of denoise left: steps left x the larger of the bar's rate and the time the
        current step has taken so far (`now` is time.time(), like `updated_at`)."""
        left = max(0, progress.total - progress.step)
        this_step = max(0.0, now - progress.updated_at)
        per_step = max(progress.seconds_per_step or 0.0, this_step)
        return left * per_step

    def decide(self, progress: Optional[DenoiseProgress], restart_s: Optional[float], *, queued: bool = False,
               since_cancel_s: float = 0.0, now: Optional[float] = None) -> CancelDecision:
        """The choice for a job cancelled `since_cancel_s` ago whose denoise is `progress`
        (None: not begun; done or aborted: over)."""
        grace_left = max(0.0, self.grace_s - since_cancel_s)
        if queued:
            return CancelDecision(NOTHING, None, restart_s, grace_left,
                                  "The job was still queued: deleted before it reached the GPU")
        if progress is None:
            return CancelDecision(NOTHING, None, restart_s, grace_left,
                                  "No denoise of this job is running yet; one that starts within "
                                  f"{self.grace_s:g} s of the cancel is weighed the same way")
        if progress.done or progress.aborted:
            return CancelDecision(NOTHING, None, restart_s, grace_left,
                                  "Its denoise had already ended: the GPU is free")
        remaining = self.remaining_s(progress, time.time() if now is None else now)
        where = f"step {progress.step}/{progress.total}"
        rate = (f" at {progress.seconds_per_step:.2f} s/step" if progress.seconds_per_step
                else " (rate not known yet)")
        if restart_s is None:
            action = RESTART if grace_left <= 0 else DRAIN
            text = (f"The cancelled job still runs on the GPU ({where}{rate}, ~{remaining:.0f} s left); this "
                    f"server's restart time is not measured (it was adopted), so it is restarted if the job is "
                    f"still running {self.grace_s:g} s after the cancel")
            return CancelDecision(action, remaining, None, grace_left, text)
        threshold = grace_left + self.ratio * restart_s + self.slack_s
        if remaining > threshold:
            when = f"in {grace_left:.0f} s unless the job ends first" if grace_left > 0 else "now"
            text = (f"Restarting the server {when}: the cancelled job would hold the GPU ~{remaining:.0f} s more "
                    f"({where}{rate}), a restart takes ~{restart_s:.0f} s (its last start)")
            return CancelDecision(RESTART, remaining, restart_s, grace_left, text)
        text = (f"Letting the cancelled job drain: GPU free in ~{remaining:.0f} s ({where}{rate}); "
                f"a restart would take ~{restart_s:.0f} s (its last start), so the server keeps running")
        return CancelDecision(DRAIN, remaining, restart_s, grace_left, text)


class LaunchClock:
    """Measures one server start, launch to ready, less the time spent downloading weights
    (a restart finds them in the cache): the restart time the cancel policy weighs."""

    def __init__(self) -> None:
        self._started: Optional[float] = None
        self._download_began: Optional[float] = None
        self._downloading_s = 0.0
        self.last_s: Optional[float] = None      # the last complete start's measurement

    def started(self) -> None:
        self._started, self._download_began, self._downloading_s = time.monotonic(), None, 0.0

    def phase(self, downloading: bool) -> None:
        """The start's phase changed (True: it is downloading weights now)."""
        now = time.monotonic()
        if downloading and self._download_began is None:
            self._download_began = now
        elif not downloading and self._download_began is not None:
            self._downloading_s += now - self._download_began
            self._download_began = None

    def ready(self) -> None:
        if self._started is None:
            return
        self.phase(False)
        self.last_s = max(0.0, time.monotonic() - self._started - self._downloading_s)
        self._started = None
