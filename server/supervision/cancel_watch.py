"""A cancelled job's denoise after the cancel: let it drain, or have the server restarted.

vLLM-Omni cannot abort a denoise that has started: a DELETEd job keeps the GPU busy until it
ends. So a cancel is weighed (cancel_policy.py: its steps left at its own rate against this
server's measured restart time), the decision is said in the status text and the log, and a
thread follows the job's denoise, deciding again as it goes (its rate, a stall), until it ends
or the restart is due. A job whose denoise has not shown up within the policy's grace never
reached the GPU.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Callable, Optional

from ..logs.logwatch import DenoiseProgress
from .cancel_policy import CancelDecision, CancelPolicy
from .status import READY, StatusBoard

if TYPE_CHECKING:
    from ..logs.logwatch import ProgressTracker

log = logging.getLogger(__name__)
CANCEL_WATCH_S = 0.5       # how often a cancelled job's denoise is looked at again


class CancelWatch:
    """The cancels of one server's jobs.

    `alive`: whether the server process lives; `ready_at`: where the ready server is, for the
    status text; `restart_time_s`: its last measured start (None: not measured); `restart`:
    have the server restarted to free the GPU (the note says why); `stopping`: set when the
    supervisor stops, which ends every follow."""

    def __init__(self, policy: CancelPolicy, progress: "ProgressTracker", board: StatusBoard,
                 stopping: threading.Event, *, alive: Callable[[], bool], ready_at: Callable[[], str],
                 restart_time_s: Callable[[], Optional[float]], restart: Callable[[str], None]) -> None:
        self.policy = policy
        self._progress = progress
        self._board = board
        self._stopping = stopping
        self._alive, self._ready_at, self._restart_time_s, self._restart = alive, ready_at, restart_time_s, restart

    def cancel_job(self, job_id: str, run_floor: int = -1, queued: bool = False) -> CancelDecision:
        """A job was cancelled (and DELETEd): decide, say so, and follow through in the
        background. `run_floor`: the last denoise run id before the job was submitted (runs up
        to it belong to earlier jobs). Returns at once with the decision for the node."""
        snap = self._job_run(run_floor) if not queued else None
        decision = self.policy.decide(snap, self._restart_time_s(), queued=queued)
        log.info("Cancel of job %s: %s", job_id, decision.text)
        if not queued:
            if self._board.phase == READY:
                self._board.set(None, self._ready_at(), note=decision.text)
            threading.Thread(target=self._follow, args=(job_id, run_floor, time.monotonic()), daemon=True,
                             name="vllm-omni-cancel").start()
        return decision

    def _job_run(self, run_floor: int) -> Optional[DenoiseProgress]:
        cur = self._progress.current()
        return cur if cur is not None and cur.run_id > run_floor and self._alive() else None

    def _follow(self, job_id: str, run_floor: int, cancelled_at: float) -> None:
        """Watch the cancelled job's denoise until it ends, re-deciding as it goes; have the
        server restarted once the policy says so and the grace is over."""
        seen = False
        while not self._stopping.wait(CANCEL_WATCH_S):
            since = time.monotonic() - cancelled_at
            cur = self._job_run(run_floor)
            running = cur is not None and not cur.done and not cur.aborted
            if not running and (seen or since >= self.policy.grace_s or not self._alive()):
                if seen and self._board.phase == READY:
                    self._board.set(None, self._ready_at(), note="the cancelled job's denoise ended, the GPU is free")
                return
            if not running:
                continue
            seen = True
            decision = self.policy.decide(cur, self._restart_time_s(), since_cancel_s=since)
            if decision.restart and decision.grace_left_s <= 0:
                log.info("Cancel of job %s: %s", job_id, decision.text)
                self._restart(f"Cancelled job {job_id} was still running on the GPU {since:.0f} s after the "
                              f"cancel (step {cur.step}/{cur.total}); restarting the server to free the GPU. "
                              f"{decision.text}")
                return
