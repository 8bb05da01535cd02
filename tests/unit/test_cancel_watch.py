"""CancelWatch (server/supervision/cancel_watch.py) on its own: what a cancel of one job decides and
says at once, and how the watch then follows the job's denoise (the real log parser fed the server's
bar lines): it asks for a restart once the policy says so, lets a drained job end with the GPU free,
and leaves alone a job that never reached the GPU, a run of an earlier job, a dead server and a stop.
The server process is faked by the `alive` flag and the restart callback; waits are on events."""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Optional

from vllm_omni_launcher.server.logs.logwatch import DenoiseProgress, ProgressTracker
from vllm_omni_launcher.server.supervision.cancel_policy import DRAIN, NOTHING, RESTART, CancelDecision, CancelPolicy
from vllm_omni_launcher.server.supervision.cancel_watch import CancelWatch
from vllm_omni_launcher.server.supervision.status import READY, StatusBoard

READY_AT = "Ready at http://127.0.0.1:8123"
WAIT_S = 20.0                                   # a bound for event waits on a busy machine, not a timing


def _bar(step: int, total: int = 20, sps: float = 2.0) -> str:
    """One redraw of the server's denoise bar (tqdm, as upstream's pipeline prints it)."""
    return f"{100 * step // total:3d}%|#         | {step}/{total} [00:{2 * step:02d}<00:40, {sps:.2f}s/it]"


@dataclass(frozen=True)
class Policy(CancelPolicy):
    """The real policy; `followed` is set once the watch weighs the job again after the cancel."""

    followed: threading.Event = field(default_factory=threading.Event, compare=False)

    def decide(self, progress: Optional[DenoiseProgress], restart_s: Optional[float], **kw: Any) -> CancelDecision:
        if kw.get("since_cancel_s"):
            self.followed.set()
        return super().decide(progress, restart_s, **kw)


class Watch:
    """A CancelWatch with its board and progress; `restarted` is set when it asks for a restart."""

    def __init__(self, policy: Policy, restart_s: Optional[float]) -> None:
        self.board = StatusBoard(threading.RLock(), lambda: None)  # type: ignore[arg-type,return-value]
        self.board.set(READY, READY_AT)
        self.progress = ProgressTracker()
        self.progress.mark_server_up()
        self.stopping = threading.Event()
        self.alive = True
        self.notes: list[str] = []
        self.restarted = threading.Event()
        self.policy = policy
        self.threads: list[threading.Thread] = []
        self.watch = CancelWatch(policy, self.progress, self.board, self.stopping, alive=lambda: self.alive,
                                 ready_at=lambda: READY_AT, restart_time_s=lambda: restart_s, restart=self._restart)

    def _restart(self, note: str) -> None:
        self.notes.append(note)
        self.restarted.set()

    def cancel(self, job_id: str, run_floor: int = -1, queued: bool = False) -> CancelDecision:
        """cancel_job, remembering the follow thread it started (if any)."""
        before = set(threading.enumerate())
        decision = self.watch.cancel_job(job_id, run_floor, queued)
        self.threads += [t for t in threading.enumerate() if t not in before and t.name == "vllm-omni-cancel"]
        return decision

    def followers_end(self) -> bool:
        """Join the follow threads this watch started; True when every one ended within the bound."""
        for thread in self.threads:
            thread.join(WAIT_S)
        return not any(t.is_alive() for t in self.threads)


def test_a_queued_job_is_deleted_before_the_gpu_and_nothing_follows_it() -> None:
    w = Watch(Policy(), restart_s=30.0)
    decision = w.cancel("j1", queued=True)
    assert decision.action == NOTHING and decision.text == "The job was still queued: deleted before it reached the GPU"
    assert w.board.text == READY_AT and w.threads == []


def test_a_long_denoise_is_restarted_away_as_soon_as_the_grace_is_over() -> None:
    w = Watch(Policy(grace_s=0.0, ratio=1.0, slack_s=0.0), restart_s=5.0)
    w.progress.feed(_bar(1))                                    # 19 steps of 2 s left: ~38 s > a 5 s restart
    decision = w.cancel("j1", run_floor=0)
    assert decision.action == RESTART and decision.text.startswith("Restarting the server now:")
    assert w.board.text == f"{READY_AT}; {decision.text}"
    assert w.restarted.wait(WAIT_S) and w.followers_end()
    (note,) = w.notes
    assert note.startswith("Cancelled job j1 was still running on the GPU ") and "after the cancel (step 1/20); " \
        "restarting the server to free the GPU. Restarting the server now: the cancelled job would hold" in note


def test_a_short_denoise_drains_and_the_status_says_when_the_gpu_is_free() -> None:
    w = Watch(Policy(grace_s=0.0), restart_s=600.0)
    w.progress.feed(_bar(18))                                   # 2 steps left: far less than a restart
    decision = w.cancel("j1", run_floor=0)
    assert decision.action == DRAIN and decision.text.startswith("Letting the cancelled job drain:")
    assert w.policy.followed.wait(WAIT_S)                       # the watch saw it run on after the cancel
    w.progress.feed(_bar(20))                                   # its last step: the denoise ended
    assert w.board.wait(lambda: True if w.board.text.endswith("the GPU is free") else None, WAIT_S)
    assert w.board.text == f"{READY_AT}; the cancelled job's denoise ended, the GPU is free"
    assert w.followers_end() and not w.restarted.is_set()


def test_a_job_whose_denoise_never_shows_up_is_left_after_the_grace() -> None:
    w = Watch(Policy(grace_s=0.0), restart_s=5.0)
    decision = w.cancel("j1", run_floor=0)
    assert decision.action == NOTHING and decision.text.startswith("No denoise of this job is running yet")
    assert w.followers_end() and not w.restarted.is_set() and w.board.text.startswith(READY_AT)


def test_an_earlier_jobs_run_is_not_the_cancelled_jobs() -> None:
    w = Watch(Policy(grace_s=0.0, ratio=1.0, slack_s=0.0), restart_s=5.0)
    w.progress.feed(_bar(1))                                    # run 1, of a job submitted before this one
    decision = w.cancel("j2", run_floor=1)
    assert decision.action == NOTHING and w.followers_end() and not w.restarted.is_set()


def test_nothing_is_restarted_for_a_dead_server_or_once_the_supervisor_stops() -> None:
    w = Watch(Policy(grace_s=0.0, ratio=1.0, slack_s=0.0), restart_s=5.0)
    w.progress.feed(_bar(1))
    w.alive = False                                             # its process is gone: no GPU work left
    assert w.cancel("j1", run_floor=0).action == NOTHING
    assert w.followers_end() and not w.restarted.is_set()

    w = Watch(Policy(grace_s=0.0, ratio=1.0, slack_s=0.0), restart_s=5.0)
    w.progress.feed(_bar(1))
    w.stopping.set()                                            # the supervisor is stopping the server itself
    assert w.cancel("j1", run_floor=0).action == RESTART
    assert w.followers_end() and not w.restarted.is_set()
