"""The owner of one vLLM-Omni server: start, watch, restart, stop, report.

It follows the SwarmUI pattern for self-started backends: a free port, a fast readiness
poll while watching the child, the log tail kept for the crash report, restarts only for a
server that had been ready (a configuration error must not loop), and a graceful-then-
forceful stop of the whole process tree. This module owns the server's generations (which
one runs, whether it is ready, the spec it runs), the operation lock, adopting a server left
running, and stopping; it holds the parts that do the rest and calls them: bringing up a
generation (`Starter`), what the log says (`LogEvents`), what happens after ready (`Recovery`,
with its monitor thread), cancelled jobs (`CancelWatch`) and the idle clock (`KeepAlive`). Each
part gets what it needs when it is made (a narrow protocol where it calls back) and never
imports this module.

Secrets stay out of `status()`: the per-launch API key exists only in the child's
environment, `api_key`, and the 0600 state file; never in argv, repr, logs or status.
"""
from __future__ import annotations

import threading
from typing import Any, Callable, Optional

from ...errors import LauncherError
from ..config.local_config import LocalConfig, default_data_dir
from ..launch.spec import DEFAULT_VERSION, LaunchSpec
from ..logs import failures, logwatch
from ..logs.failures import LaunchCancelled
from ..logs.logwatch import DenoiseProgress
from ..process import cancel_wait, gpu_lock, launch_prep, timeouts
from ..process.cancel_wait import ShouldCancel
from ..process.server_run import RunningServer, ServerRun
from .cancel_policy import CancelDecision, CancelPolicy, LaunchClock
from .cancel_watch import CancelWatch
from .keep_alive import KeepAlive
from .log_events import LogEvents
from .multi_host import ServerRole
from .recovery import Recovery
from .restart_policy import RestartPolicy
from .starting import Starter
from .status import FAILED, READY, RESTARTING, STOPPED, STOPPING, Status, StatusBoard, StatusCallback

Fallback = Callable[[LaunchSpec, str], Optional[tuple[LaunchSpec, str]]]


class Supervisor:
    """Starts and supervises one `vllm serve MODEL --omni` server across its generations."""

    def __init__(self, spec: LaunchSpec, config: LocalConfig, fallback: Optional[Fallback] = None, *,
                 keep_alive_minutes: Optional[float] = None, api_key: launch_prep.KeyMode = True,
                 restart_policy: Optional[RestartPolicy] = None, cancel_policy: Optional[CancelPolicy] = None,
                 role: Optional[ServerRole] = None) -> None:
        """`api_key`: True = a fresh random key per launch (default), False = no key
        (trusted machine, `serve --no-api-key`), a string = that key (tests/CLI only).
        `role`: a plain server (default), a head accepting replicas or a joined replica (multi_host.py)."""
        self.requested_spec = spec
        self.spec = spec                     # what runs; differs from requested after an OOM fallback
        self.config = config
        self.fallback = fallback
        self.role = role or ServerRole()
        self._data_dir = config.data_dir or default_data_dir()
        self._lock = threading.RLock()       # guards the fields below
        self._op_lock = threading.RLock()    # one start/restart/stop at a time
        self._stop_evt = threading.Event()
        self._board = StatusBoard(self._lock, self.status)
        self._run: Optional[ServerRun] = None   # the current generation, or the last one after a stop
        self._ready = False
        self._generation = 0
        self._progress = logwatch.ProgressTracker()
        self._gpus = gpu_lock.GpuClaim(config.gpu_lock_dir)   # held across generations on the same GPUs
        self._launch_clock = LaunchClock()
        self._idle = KeepAlive(config.keep_alive_minutes if keep_alive_minutes is None else keep_alive_minutes)
        self._recovery = Recovery(self, self._board, self._progress, lock=self._lock, op_lock=self._op_lock,
                                  stopping=self._stop_evt, restarts=restart_policy or RestartPolicy(),
                                  keep_alive=self._idle, hang_timeout_s=config.hang_timeout_s)
        self._monitor = self._recovery.monitor
        self._log = LogEvents(self._board, self._progress, self._launch_clock, run=lambda: self._run,
                              ready=lambda: self._ready, used=self._idle.touch, job_oom=self._recovery.on_job_oom)
        self._cancels = CancelWatch(cancel_policy or CancelPolicy(), self._progress, self._board, self._stop_evt,
                                    alive=self.alive, ready_at=self.ready_at,
                                    restart_time_s=lambda: self.restart_time_s,
                                    restart=self._recovery.restart_for_cancel)
        self._starter = Starter(self, self._board, self._progress, self._log, self._launch_clock, self._gpus,
                                config=config, role=self.role, key_mode=api_key, data_dir=self._data_dir)

    # ---- what others read ----------------------------------------------------------------
    def _from_run(self, name: str) -> Any:
        """An attribute of the current (or last) generation; None before the first start."""
        run = self._run
        return getattr(run, name) if run is not None else None

    @property
    def run(self) -> Optional[ServerRun]:
        """The current generation, or the last one after a stop; None before the first start."""
        return self._run

    @property
    def url(self) -> Optional[str]:
        return self._from_run("url")

    @property
    def api_key(self) -> Optional[str]:
        return self._from_run("api_key")

    @property
    def generation(self) -> int:
        return self._generation

    @property
    def server_version(self) -> tuple[int, int]:
        """(major, minor) of the running vLLM, from its log; the pinned default until seen."""
        return self._log.server_version or DEFAULT_VERSION

    @property
    def restart_time_s(self) -> Optional[float]:
        """This server's last start, launch to ready without downloads (None: not measured)."""
        return self._launch_clock.last_s

    @property
    def last_error(self) -> Optional[LauncherError]:
        return self._board.last_error

    @property
    def log_path(self) -> Optional[str]:
        return self._from_run("log_path")

    @property
    def storage_dir(self) -> Optional[str]:
        """The folder the current server stores finished MP4s in (launch_prep.py's, on this machine): a client
        given it reads a job's MP4 there instead of downloading it (client/local_result.py)."""
        return self._from_run("storage") or None

    @property
    def pgid(self) -> Optional[int]:
        return self._from_run("pgid")

    @property
    def replica_pids(self) -> list[int]:
        """The ready server's replica processes, in upstream's replica order ([] for one replica)."""
        return self._recovery.replicas.pids()

    @property
    def keep_alive_minutes(self) -> float:
        """Idle minutes after which the server is stopped (<= 0: never); the registry may change it."""
        return self._idle.minutes

    @keep_alive_minutes.setter
    def keep_alive_minutes(self, minutes: float) -> None:
        self._idle.minutes = minutes

    @property
    def cancel_policy(self) -> CancelPolicy:
        """How a cancelled job's denoise is weighed against a restart (cancel_policy.py)."""
        return self._cancels.policy

    @cancel_policy.setter
    def cancel_policy(self, policy: CancelPolicy) -> None:
        self._cancels.policy = policy

    def __repr__(self) -> str:
        return (f"Supervisor(model={self.spec.model!r}, gpus={gpu_lock.describe(self.spec.gpus)!r}, "
                f"phase={self._board.phase!r}, url={self.url!r}, generation={self._generation})")

    __str__ = __repr__

    def status(self) -> Status:
        with self._lock:
            run = self._run
            return Status(ready=self._ready and run is not None and run.running,
                          pid=self._from_run("server_pid"), port=self._from_run("port"),
                          url=self.url, generation=self._generation, fingerprint=self.spec.fingerprint(),
                          requested_fingerprint=self.requested_spec.fingerprint(),
                          restarts=self._recovery.restart_count, log_path=self.log_path, **self._board.fields())

    def listen(self, on_status: StatusCallback, replay: bool = True) -> None:
        """Send status changes to `on_status` (only changes; `replay`: the current one now)."""
        self._board.listen(on_status, replay=replay)

    def unlisten(self, on_status: StatusCallback) -> None:
        """Stop sending to `on_status` (its launch is over); a newer listener stays."""
        self._board.unlisten(on_status)

    def alive(self) -> bool:
        run = self._run
        return run is not None and run.alive()

    def ready(self) -> bool:
        return self._ready and self.alive()

    def progress(self) -> Optional[DenoiseProgress]:
        """The current (or last) job's denoise progress; None before the first job."""
        return self._progress.current()

    def job_hint(self) -> tuple[int, Callable[[], int]]:
        """The next job's run floor and fast-poll hint from this server's log (logwatch.fast_poll_hint)."""
        return logwatch.fast_poll_hint(self.progress, self._nudge_log)

    def _nudge_log(self) -> None:
        run = self._run
        if run is not None:
            run.nudge_log()

    def mark_job_activity(self) -> None:
        """A job is being submitted or polled: the keep-alive idle clock restarts."""
        self._idle.touch()

    def tail(self, lines: int = 40) -> list[str]:
        """The server log's last lines (API key masked), for reports."""
        run = self._run
        return run.tail(lines) if run is not None else []

    def wait_ready(self, timeout: Optional[float] = None) -> bool:
        """Block until ready (True), or stopped/failed/timeout (False)."""
        def done() -> Optional[bool]:
            if self._ready and self._run is not None and self._run.running:
                return True
            return False if self._board.phase in (STOPPED, FAILED) and not self._monitor.pending else None
        return self._board.wait(done, timeout)

    def cancel_job(self, job_id: str, run_floor: int = -1, queued: bool = False) -> CancelDecision:
        """A job was cancelled (and DELETEd): drain its denoise or restart the server
        (cancel_watch.py). Returns at once with the decision for the node."""
        return self._cancels.cancel_job(job_id, run_floor, queued)

    def ready_at(self) -> str:
        """Where the ready server is, for the texts after ready (its URL; a joined replica's GPUs and head)."""
        return self.role.ready_at(self.spec, gpu_lock.describe(self.spec.gpus), self.url)

    # ---- start -------------------------------------------------------------------------
    def start(self, on_status: Optional[StatusCallback] = None, timeout: Optional[float] = None,
              should_cancel: Optional[ShouldCancel] = None) -> "Supervisor":
        """Start the server (or return at once if it already runs); block until ready.

        Raises LauncherError (a `failures.ServerFailure` with `.kind`) when it cannot start;
        with a fallback set, an out-of-memory start is retried once per leaner spec first.
        When `should_cancel()` turns true (or `stop()` is called) the start gives up: its
        process group is gone within 2 s and `LaunchCancelled` is raised.
        """
        if on_status is not None:
            self._board.listen(on_status)
        asked = cancel_wait.quiet(should_cancel)
        if not cancel_wait.acquire(self._op_lock, asked):
            raise LaunchCancelled(self._board.text)
        try:
            self._stop_evt.clear()
            pending = self._monitor.take_request()
            if pending is not None and self.alive():
                self._recovery.handle_request_locked(*pending)   # e.g. a hard-cancel restart not yet begun
            if self.alive() and self._ready:
                self.mark_job_activity()
                self._board.emit(force=on_status is not None)
                return self
            if self.alive():                 # e.g. an adopted server that is not answering
                self.stop_process(graceful=False, timeout=timeouts.REPLACE_STOP_S)
            self._recovery.restarts.reset()
            try:
                self._starter.start(timeout, None, lambda: self._stop_evt.is_set() or asked())
            except LaunchCancelled:
                self.end(STOPPED, "Start cancelled; nothing is left running", timeouts.CANCEL_STOP_S)
                raise
            except BaseException:
                self.end(None, None, timeouts.REPLACE_STOP_S)
                raise
            self._monitor.ensure_running()
            return self
        finally:
            self._op_lock.release()

    # ---- for its parts (recovery.Lifecycle, starting.Generations) -----------------------
    def launch(self, preferred_port: Optional[int]) -> None:
        """A new generation after ready (a restart): ready on return, or raising; a stop ends it."""
        self._starter.start(None, preferred_port, self._stop_evt.is_set)

    def ready_run(self) -> Optional[ServerRun]:
        """The ready generation to watch, or None (not ready, or a stop was asked for)."""
        return self._run if self._ready and not self._stop_evt.is_set() else None

    def mark_not_ready(self) -> None:
        """The server is about to be restarted: it takes no more jobs."""
        with self._lock:
            self._ready = False

    def step_down(self, spec: LaunchSpec, kind: str) -> Optional[tuple[LaunchSpec, str]]:
        """Switch to the fallback's leaner spec after an out-of-memory `kind` and say so; None
        when there is no fallback, no leaner spec, or the proposal is invalid."""
        try:
            nxt = self.fallback(spec, kind) if self.fallback is not None else None
            if nxt is not None:
                nxt[0].validate()
        except Exception:  # noqa: BLE001 - a planner bug or an invalid proposal must not hide the real failure
            return None
        if nxt is None:
            return None
        with self._lock:
            self.spec = nxt[0]
        self._board.add_note(nxt[1])
        self._board.set(RESTARTING, f"Out of GPU memory; retrying with a leaner configuration: {nxt[1]}")
        return nxt

    def begin_generation(self) -> int:
        """A new generation is being spawned: its number; not ready until `now_ready`."""
        with self._lock:
            self._generation += 1
            self._ready = False
            return self._generation

    def spawned(self, run: ServerRun) -> None:
        """`run` is the current generation from now on (a stop ends it, even while it starts)."""
        with self._lock:
            self._run = run

    def now_ready(self, spec: LaunchSpec, run: ServerRun, text: str) -> None:
        """`run` (of `spec`) is ready: it takes jobs, recovery watches it, its state file says so."""
        with self._lock:
            self._ready = True
            self._idle.touch()
        self._progress.mark_server_up()
        missing = self._recovery.watch_ready(self.role, spec, run)
        if missing:
            self._board.add_warning(missing)
        run.write_state(self.requested_spec.fingerprint(), ready=True)
        self._board.set(READY, text, note=self.role.ready_note)

    def failure_context(self, spec: LaunchSpec, exit_code: Optional[int], ever_ready: bool) -> failures.Context:
        """What a failure's explanation needs to know about this server (failures.classify)."""
        run = self._run
        port = run.port if run is not None and self.role.serves_http else None
        return failures.Context(model=spec.model, gpus=gpu_lock.describe(spec.gpus),
                                world_size=spec.parallel.world_size, port=port,
                                port_configured=bool(spec.port or self.config.port), ever_ready=ever_ready,
                                exit_code=exit_code, log_path=getattr(run, "log_path", "") or "")

    # ---- stop --------------------------------------------------------------------------
    def request_stop(self) -> None:
        """Ask a start or restart in progress to give up soon; safe from signal handlers."""
        self._stop_evt.set()
        self._monitor.wake()

    def stop(self, timeout: float = timeouts.STOP_S) -> None:
        """Stop the server's whole process group (SIGINT, SIGTERM, SIGKILL), verify it, and
        free its GPUs."""
        self.request_stop()
        with self._op_lock:
            if self._run is not None and self._run.running:
                self._board.set(STOPPING, "Stopping the server")
            failed = self._board.phase == FAILED and self._board.last_error is not None
            self.end(None if failed else STOPPED, "Stopped", timeout, graceful=True)
        self._monitor.join()

    def end(self, phase: Optional[str], text: Optional[str], timeout: float, graceful: bool = False) -> None:
        """The server's life is over: no process left, GPUs released, the phase says why."""
        self.stop_process(graceful=graceful, timeout=timeout)
        self._gpus.release()
        if phase is not None:
            self._board.set(phase, text)

    def stop_process(self, graceful: bool, timeout: float) -> None:
        with self._lock:
            run, self._ready = self._run, False
        if run is None:
            return
        left = run.stop(graceful=graceful, timeout=timeout)
        self._progress.abort_current()
        if left:
            self._board.set_error(LauncherError(
                f"Server processes {left} did not exit after SIGKILL",
                "they are stuck in the kernel (usually a GPU driver call) and still hold GPU memory",
                "check `nvidia-smi`; if they stay, the GPU driver needs attention (or a reboot)"))

    # ---- a server this process did not start -------------------------------------------
    @classmethod
    def attach(cls, running: RunningServer, config: LocalConfig, requested: LaunchSpec,
               fallback: Optional[Fallback] = None, keep_alive_minutes: Optional[float] = None) -> "Supervisor":
        """Supervise `running` from now on: take its GPUs' lock (raises when another live
        launcher holds them), bind its life to ours with a guard watchdog, follow its log."""
        sup = cls(requested, config, fallback, keep_alive_minutes=keep_alive_minutes)
        sup.spec = running.spec
        sup._gpus.claim(launch_prep.gpu_targets(running.spec, config), running.spec.served_name)
        run = ServerRun.adopt(running, sup._data_dir, sup._log.on_segment)
        with sup._lock:
            sup._run, sup._generation, sup._ready = run, 1, True
        sup._gpus.show_url(run.url)
        sup.now_ready(running.spec, run, f"Ready: reused the server left running at {run.url} "
                                          f"({running.spec.served_name})")
        sup._monitor.ensure_running()
        return sup

