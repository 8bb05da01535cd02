"""Once a server has been ready: what is watched, and what happens when something goes wrong.

The monitor (monitor.py) notices events: the process exited, a replica process or the role's
own watch failed, `/health` failed too long, the keep-alive ran out, a request was queued. This
part reacts. A crash or a hang restarts the server within the restart budget (restart_policy.py)
on the same port; a permanent failure (a config error) or a spent budget ends it as failed with
the reason; a job that ran out of memory switches to the fallback's leaner spec; a cancelled
job that is best stopped by a restart (cancel_watch.py) gets one; an idle server is stopped.
Every reaction runs under the supervisor's operation lock, so it never overlaps a start or a stop.

What it asks of its supervisor (starting a generation, stopping the process, stepping down the
fallback, the texts) is the `Lifecycle` protocol below.
"""
from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Optional, Protocol

from ...errors import LauncherError
from ..logs import failures
from ..logs.failures import ServerFailure
from ..process import timeouts
from . import replica_watch
from .keep_alive import KeepAlive
from .monitor import Monitor
from .restart_policy import RestartPolicy
from .status import FAILED, READY, RESTARTING, STOPPED, StatusBoard

if TYPE_CHECKING:
    from ..launch.spec import LaunchSpec
    from ..logs.logwatch import ProgressTracker
    from ..process.server_run import ServerRun
    from .multi_host import ServerRole, Watch

OOM_REPEAT_S = 5.0         # one traceback prints several OOM lines: one job OOM per this window


class Lifecycle(Protocol):
    """The supervisor's operations recovery uses."""

    spec: "LaunchSpec"
    fallback: Optional[Callable[..., Any]]

    @property
    def run(self) -> Optional["ServerRun"]: ...           # the current (or last) generation
    @property
    def generation(self) -> int: ...
    def ready_run(self) -> Optional["ServerRun"]: ...      # the ready generation unless stopping
    def mark_not_ready(self) -> None: ...
    def tail(self, lines: int = 40) -> list[str]: ...
    def ready_at(self) -> str: ...
    def failure_context(self, spec: "LaunchSpec", exit_code: Optional[int], ever_ready: bool) -> failures.Context: ...
    def step_down(self, spec: "LaunchSpec", kind: str) -> Optional[tuple["LaunchSpec", str]]: ...
    def launch(self, preferred_port: Optional[int]) -> None: ...   # a new generation, ready or raising
    def stop_process(self, graceful: bool, timeout: float) -> None: ...
    def end(self, phase: Optional[str], text: Optional[str], timeout: float, graceful: bool = False) -> None: ...


class Recovery:
    """The monitor of one supervised server, its hooks (monitor.Watched), and the restart logic.

    `lock`: the supervisor's state lock; `op_lock`: its one-operation-at-a-time lock;
    `stopping`: set when the supervisor stops (every wait here ends)."""

    def __init__(self, owner: Lifecycle, board: StatusBoard, progress: "ProgressTracker", *,
                 lock: "threading.RLock", op_lock: "threading.RLock", stopping: threading.Event,
                 restarts: RestartPolicy, keep_alive: KeepAlive, hang_timeout_s: float) -> None:
        self._owner = owner
        self._board = board
        self._progress = progress
        self._lock = lock
        self._op_lock = op_lock
        self._stopping = stopping
        self.restarts = restarts
        self.keep_alive = keep_alive
        self.hang_timeout_s = hang_timeout_s
        self.restart_count = 0
        self.monitor = Monitor(self, lock)
        self.replicas = replica_watch.ReplicaWatch([], 1)    # the ready run's replica processes (several only)
        self._role_watch: Optional["Watch"] = None           # the role's own check of the ready run
        self._last_oom_at = 0.0

    # ---- what is watched once ready ---------------------------------------------------------
    def watch_ready(self, role: "ServerRole", spec: "LaunchSpec", run: "ServerRun") -> Optional[str]:
        """Record the ready server's replica processes (upstream never restarts a dead one and
        /health stays 200, so they are looked at here) and start the role's own watch (a head's
        wedge, a joined replica's head). Returns the warning when not every replica was found."""
        self._role_watch = role.watch(run, self._progress)
        expected = spec.replicas if role.watches_replica_processes else 1
        self.replicas = replica_watch.ReplicaWatch.find(run.server_pid, expected)
        return None if self.replicas.complete else replica_watch.missing_note(self.replicas)

    # ---- the monitor's hooks (monitor.Watched) -----------------------------------------------
    def watched_run(self) -> Optional["ServerRun"]:
        return self._owner.ready_run()

    def monitor_finished(self) -> bool:
        return self._stopping.is_set() or (self._board.phase in (STOPPED, FAILED) and not self.monitor.pending)

    def on_request(self, reason: str, note: str) -> None:
        with self._op_lock:
            if not self._stopping.is_set():
                self.handle_request_locked(reason, note)

    def on_hang(self, seconds: float) -> None:
        err = failures.hung(seconds, self._owner.tail(40))
        self._board.set_error(err)
        self._restart_after(err, "hung")

    def idle_expired(self) -> bool:
        return self.keep_alive.expired(self._progress)

    def on_idle(self) -> None:
        with self._op_lock:
            if not self.idle_expired() or self._stopping.is_set():
                return
            self._owner.end(STOPPED, self.keep_alive.stopped_text(), timeouts.STOP_S, graceful=True)

    def on_exit(self, code: int) -> None:
        """The server died after being ready: restart it, or give up and say why."""
        run = self._owner.run
        if run is not None:
            run.drain()
        tail = self._owner.tail(200)
        failure = failures.classify(tail, self._owner.failure_context(self._owner.spec, exit_code=code,
                                                                      ever_ready=True))
        self._board.set_error(failure)
        self._restart_after(failure, "crash")

    def dead_replica(self) -> Optional[ServerFailure]:
        """The failure of a replica process of the ready server that is gone, or what the role's
        watch found (a wedged head, a joined replica's head gone: multi_host.py)."""
        lost = self._role_watch() if self._role_watch is not None else None
        if lost is not None:
            return lost
        dead = self.replicas.dead()
        return None if dead is None else replica_watch.replica_died(dead, self.replicas.expected,
                                                                    self._owner.tail(40))

    def on_replica_exit(self, failure: ServerFailure) -> None:
        """A replica died while the server process lives on: restart the whole group, within the
        restart budget, as for a crash of the server itself."""
        self.replicas = replica_watch.ReplicaWatch([], 1)   # reported once; the next start finds the new ones
        self._role_watch = None
        self._board.set_error(failure)
        self._restart_after(failure, "crash")

    # ---- restarting ----------------------------------------------------------------------
    def _restart_after(self, failure: ServerFailure, reason: str) -> bool:
        owner = self._owner
        with self._op_lock:
            if self._stopping.is_set():
                return False
            delay = self.restarts.next_delay()
            if delay is None:
                owner.end(FAILED, f"{self.restarts.give_up_text()}: {failure.what}", timeouts.REPLACE_STOP_S)
                return False
            what = "stopped answering" if reason == "hung" else failure.what.rstrip(".")
            self._board.set_restart_reason(f"{failure.what.rstrip('.')} ({failure.kind})")
            self._board.set(RESTARTING, f"{what}; restarting in {delay:g} s (restart {self.restarts.recent} "
                                        f"of at most {self.restarts.max_restarts})")
            owner.stop_process(graceful=False, timeout=timeouts.REPLACE_STOP_S)
            if failure.kind == failures.OOM_JOB and owner.fallback is not None:
                owner.step_down(owner.spec, failures.OOM_JOB)
            if self._stopping.wait(delay):
                return False
            return self._relaunch(f"Restarted after: {what}")

    def _relaunch(self, ready_text: str) -> bool:
        owner = self._owner
        with self._op_lock:
            if self._stopping.is_set():
                return False
            previous_port = owner.run.port if owner.run is not None else None
            try:
                owner.stop_process(graceful=False, timeout=timeouts.REPLACE_STOP_S)
                owner.launch(previous_port)
            except ServerFailure as failure:
                if self._stopping.is_set():
                    return False
                if failure.kind in failures.PERMANENT - {failures.OOM_LOAD}:
                    owner.end(FAILED, failure.what, timeouts.REPLACE_STOP_S)
                    return False
                return self._restart_after(failure, "crash")
            except LauncherError as err:
                self._board.set_error(err)
                owner.end(FAILED, err.what, timeouts.REPLACE_STOP_S)
                return False
            with self._lock:
                self.restart_count += 1
            self._board.set(READY, f"{ready_text}. {owner.ready_at()} (generation {owner.generation})")
            return True

    def handle_request_locked(self, reason: str, note: str) -> None:
        """A queued request (`on_request`, or a start that found one not yet begun), under the
        operation lock: a restart onto the leaner spec after a job OOM, or for a hard cancel."""
        owner = self._owner
        if reason == "oom_job":
            if owner.step_down(owner.spec, failures.OOM_JOB) is None:
                self._board.set(None, owner.ready_at(), note="the last job ran out of GPU memory and the fallback "
                                                             "has no leaner configuration left")
                return
            change = self._board.fallback_notes[-1]
            self._board.set_restart_reason(f"a job ran out of GPU memory; fallback: {change}")
            self._board.set(RESTARTING, f"Restarting with the leaner configuration: {change}")
            self._relaunch(f"Restarted with: {change}")
        elif reason == "hard_cancel":
            self._board.set(RESTARTING, note)
            self.restarts.book()
            self._relaunch(note.split(";")[0])

    def restart_for_cancel(self, note: str) -> None:
        """Restart the server to free the GPU from a cancelled job's denoise (cancel_watch.py):
        queued for the monitor, so the slow restart never runs on the cancel's thread."""
        self._progress.abort_current()
        self._owner.mark_not_ready()
        self._board.set_restart_reason(note)
        self.monitor.request("hard_cancel", note)
        self._board.set(RESTARTING, note)

    # ---- a job that ran out of memory (seen in the log) -------------------------------------
    def on_job_oom(self, text: str) -> None:
        now = time.monotonic()
        if now - self._last_oom_at < OOM_REPEAT_S:
            return
        self._last_oom_at = now
        self._progress.abort_current()
        tail = self._owner.tail(40)
        if text not in tail:
            tail.append(text)
        err = failures.oom_job_error(tail, self._owner.failure_context(self._owner.spec, None, True))
        self._board.set_error(err)
        if self._owner.fallback is not None:
            self.monitor.request("oom_job", "a job ran out of GPU memory")
        else:
            self._board.set(None, self._owner.ready_at(), note=f"the last job ran out of GPU memory ({err.fix})")
