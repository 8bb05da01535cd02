"""What a supervisor does once its server has been ready: restart, fall back, give up, idle-stop.

monitor.py notices events (exit, hang, idle, queued requests); this half of the Supervisor
reacts to them. A crash or a hang restarts the server within the restart budget
(restart_policy.py) on the same port, a permanent failure (a config error) or a spent budget
ends it as failed with the reason, a job that ran out of memory switches to the fallback's
leaner spec, a cancelled job still denoising either drains or, when that would take longer
than this server's own restart (cancel_policy.py), gets the server restarted, and the
keep-alive stops an idle one. Every reaction runs under the supervisor's operation
lock, so it never overlaps a start or a stop.

`Recovery` is a mixin of `Supervisor` (supervisor.py), split out to keep each file about one
concern; the annotations below are the supervisor state and methods it relies on.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Optional

from ..errors import LauncherError
from . import failures, replicas, timeouts
from .cancel_policy import CancelDecision, CancelPolicy
from .failures import ServerFailure
from .logwatch import DenoiseProgress
from .restart_policy import RestartPolicy
from .status import FAILED, READY, RESTARTING, STOPPED, StatusBoard

log = logging.getLogger(__name__)
CANCEL_WATCH_S = 0.5       # how often a cancelled job's denoise is looked at again

if TYPE_CHECKING:
    from .logwatch import ProgressTracker
    from .monitor import Monitor
    from .server_run import ServerRun
    from .spec import LaunchSpec


class Recovery:
    """The monitor's hooks and the restart logic of a Supervisor."""

    if TYPE_CHECKING:      # provided by Supervisor
        spec: "LaunchSpec"
        fallback: Optional[Callable[..., Any]]
        keep_alive_minutes: float
        url: Optional[str]
        _lock: "threading.RLock"
        _op_lock: "threading.RLock"
        _board: StatusBoard
        _monitor: "Monitor"
        _progress: "ProgressTracker"
        _restarts: RestartPolicy
        _replicas: replicas.ReplicaWatch
        _role_watch: Optional[Callable[[], Optional[ServerFailure]]]
        _run: Optional["ServerRun"]
        _ready: bool
        _stop_evt: threading.Event
        _generation: int
        _restart_count: int
        _last_activity: float
        _last_oom_at: float
        cancel_policy: CancelPolicy
        restart_time_s: Optional[float]

        def tail(self, lines: int = 40) -> list[str]: ...
        def alive(self) -> bool: ...
        def wait_ready(self, timeout: Optional[float] = None) -> bool: ...
        def _set(self, phase: Optional[str] = None, text: Optional[str] = None) -> None: ...
        def _ready_at(self) -> str: ...
        def _context(self, spec: "LaunchSpec", exit_code: Optional[int], ever_ready: bool) -> failures.Context: ...
        def _next_fallback(self, spec: "LaunchSpec", kind: str) -> Optional[tuple["LaunchSpec", str]]: ...
        def _launch_with_fallback(self, timeout: Optional[float], preferred_port: Optional[int],
                                  cancel: Callable[[], bool]) -> None: ...
        def _stop_process(self, graceful: bool, timeout: float) -> None: ...
        def _end(self, phase: Optional[str], text: Optional[str], timeout: float, graceful: bool = False) -> None: ...

    # ---- the monitor's hooks (monitor.Watched) -------------------------------------------
    def watched_run(self) -> Optional[ServerRun]:
        return self._run if self._ready and not self._stop_evt.is_set() else None

    def monitor_finished(self) -> bool:
        return self._stop_evt.is_set() or (self._board.phase in (STOPPED, FAILED) and not self._monitor.pending)

    def on_request(self, reason: str, note: str) -> None:
        with self._op_lock:
            if not self._stop_evt.is_set():
                self._handle_request_locked(reason, note)

    def on_hang(self, seconds: float) -> None:
        err = failures.hung(seconds, self.tail(40))
        self._board.set_error(err)
        self._restart_after(err, "hung")

    def idle_expired(self) -> bool:
        minutes = self.keep_alive_minutes or 0
        if minutes <= 0:
            return False
        cur = self._progress.current()
        if cur is not None and not cur.done and not cur.aborted:
            return False                     # a denoise is running right now
        return time.time() - max(self._last_activity, self._progress.last_seen) >= minutes * 60

    def on_idle(self) -> None:
        with self._op_lock:
            if not self.idle_expired() or self._stop_evt.is_set():
                return
            self._end(STOPPED, f"Stopped after {self.keep_alive_minutes:g} idle minute(s) to free the GPUs; "
                               "the next job starts it again", timeouts.STOP_S, graceful=True)

    def on_exit(self, code: int) -> None:
        """The server died after being ready: restart it, or give up and say why."""
        if self._run is not None:
            self._run.drain()
        tail = self.tail(200)
        failure = failures.classify(tail, self._context(self.spec, exit_code=code, ever_ready=True))
        self._board.set_error(failure)
        self._restart_after(failure, "crash")

    def dead_replica(self) -> Optional[ServerFailure]:
        """The failure of a replica process of the ready server that is gone, or what the role's
        watch found (a wedged head, a joined replica's head gone: multi_host.py) (monitor.Watched)."""
        lost = self._role_watch() if self._role_watch is not None else None
        if lost is not None:
            return lost
        dead = self._replicas.dead()
        return None if dead is None else replicas.replica_died(dead, self._replicas.expected, self.tail(40))

    def on_replica_exit(self, failure: ServerFailure) -> None:
        """A replica died while the server process lives on: restart the whole group, within the
        restart budget, as for a crash of the server itself."""
        self._replicas = replicas.ReplicaWatch([], 1)   # reported once; the next start finds the new ones
        self._role_watch = None
        self._board.set_error(failure)
        self._restart_after(failure, "crash")

    def _restart_after(self, failure: ServerFailure, reason: str) -> bool:
        with self._op_lock:
            if self._stop_evt.is_set():
                return False
            delay = self._restarts.next_delay()
            if delay is None:
                self._end(FAILED, f"{self._restarts.give_up_text()}: {failure.what}", timeouts.REPLACE_STOP_S)
                return False
            what = "stopped answering" if reason == "hung" else failure.what.rstrip(".")
            self._board.set_restart_reason(f"{failure.what.rstrip('.')} ({failure.kind})")
            self._set(RESTARTING, f"{what}; restarting in {delay:g} s (restart {self._restarts.recent} "
                                  f"of at most {self._restarts.max_restarts})")
            self._stop_process(graceful=False, timeout=timeouts.REPLACE_STOP_S)
            if failure.kind == failures.OOM_JOB and self.fallback is not None:
                self._next_fallback(self.spec, failures.OOM_JOB)
            if self._stop_evt.wait(delay):
                return False
            return self._relaunch(f"Restarted after: {what}")

    def _relaunch(self, ready_text: str) -> bool:
        with self._op_lock:
            if self._stop_evt.is_set():
                return False
            previous_port = self._run.port if self._run is not None else None
            try:
                self._stop_process(graceful=False, timeout=timeouts.REPLACE_STOP_S)
                self._launch_with_fallback(None, previous_port, self._stop_evt.is_set)
            except ServerFailure as failure:
                if self._stop_evt.is_set():
                    return False
                if failure.kind in failures.PERMANENT - {failures.OOM_LOAD}:
                    self._end(FAILED, failure.what, timeouts.REPLACE_STOP_S)
                    return False
                return self._restart_after(failure, "crash")
            except LauncherError as err:
                self._board.set_error(err)
                self._end(FAILED, err.what, timeouts.REPLACE_STOP_S)
                return False
            with self._lock:
                self._restart_count += 1
            self._set(READY, f"{ready_text}. {self._ready_at()} (generation {self._generation})")
            return True

    def _handle_request_locked(self, reason: str, note: str) -> None:
        if reason == "oom_job":
            if self._next_fallback(self.spec, failures.OOM_JOB) is None:
                self._set(None, f"{self._ready_at()}; the last job ran out of GPU memory and the fallback "
                                "has no leaner configuration left")
                return
            change = self._board.fallback_notes[-1]
            self._board.set_restart_reason(f"a job ran out of GPU memory; fallback: {change}")
            self._set(RESTARTING, f"Restarting with the leaner configuration: {change}")
            self._relaunch(f"Restarted with: {change}")
        elif reason == "hard_cancel":
            self._set(RESTARTING, note)
            self._restarts.book()
            self._relaunch(note.split(";")[0])

    # ---- a job that ran out of memory (seen in the log) -----------------------------------
    def _on_job_oom(self, text: str) -> None:
        now = time.monotonic()
        if now - self._last_oom_at < 5.0:       # one traceback prints several OOM lines
            return
        self._last_oom_at = now
        self._progress.abort_current()
        tail = self.tail(40)
        if text not in tail:
            tail.append(text)
        err = failures.oom_job_error(tail, self._context(self.spec, None, True))
        self._board.set_error(err)
        if self.fallback is not None:
            self._monitor.request("oom_job", "a job ran out of GPU memory")
        else:
            self._set(None, f"{self._ready_at()}; the last job ran out of GPU memory ({err.fix})")

    # ---- cancel ------------------------------------------------------------------------
    def cancel_job(self, job_id: str, run_floor: int = -1, queued: bool = False) -> CancelDecision:
        """A job was cancelled (and DELETEd): weigh draining its denoise against a restart
        (cancel_policy.py), say so in the status text and the log, and follow through in the
        background. `run_floor`: the last denoise run id before the job was submitted (runs
        up to it belong to earlier jobs). Returns at once with the decision for the node."""
        snap = self._job_run(run_floor) if not queued else None
        decision = self.cancel_policy.decide(snap, self.restart_time_s, queued=queued)
        log.info("Cancel of job %s: %s", job_id, decision.text)
        if not queued:
            if self._board.phase == READY:
                self._set(None, f"{self._ready_at()}; {decision.text}")
            threading.Thread(target=self._follow_cancel, args=(job_id, run_floor, time.monotonic()), daemon=True,
                             name="vllm-omni-cancel").start()
        return decision

    def _job_run(self, run_floor: int) -> Optional[DenoiseProgress]:
        cur = self._progress.current()
        return cur if cur is not None and cur.run_id > run_floor and self.alive() else None

    def _follow_cancel(self, job_id: str, run_floor: int, cancelled_at: float) -> None:
        """Watch the cancelled job's denoise until it ends, re-deciding as it goes (its rate, a
        stall); restart the server once the policy says so and the grace is over. A job whose
        denoise has not shown up within the grace never reached the GPU."""
        seen = False
        while not self._stop_evt.wait(CANCEL_WATCH_S):
            since = time.monotonic() - cancelled_at
            cur = self._job_run(run_floor)
            running = cur is not None and not cur.done and not cur.aborted
            if not running and (seen or since >= self.cancel_policy.grace_s or not self.alive()):
                if seen and self._board.phase == READY:
                    self._set(None, f"{self._ready_at()}; the cancelled job's denoise ended, the GPU is free")
                return
            if not running:
                continue
            seen = True
            decision = self.cancel_policy.decide(cur, self.restart_time_s, since_cancel_s=since)
            if decision.restart and decision.grace_left_s <= 0:
                log.info("Cancel of job %s: %s", job_id, decision.text)
                self._restart_for_cancel(job_id, cur, since, decision.text)
                return

    def _restart_for_cancel(self, job_id: str, cur: DenoiseProgress, after_s: float, why: str) -> None:
        note = (f"Cancelled job {job_id} was still running on the GPU {after_s:.0f} s after the cancel "
                f"(step {cur.step}/{cur.total}); restarting the server to free the GPU. {why}")
        self._progress.abort_current()
        with self._lock:
            self._ready = False
        self._board.set_restart_reason(note)
        self._monitor.request("hard_cancel", note)
        self._set(RESTARTING, note)
