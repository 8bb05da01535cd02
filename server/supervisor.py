"""The owner of one vLLM-Omni server: start, watch, restart, stop, report.

It follows the SwarmUI pattern for self-started backends: a free port, a fast readiness
poll while watching the child, the log tail kept for the crash report, restarts only for a
server that had been ready (a configuration error must not loop), and a graceful-then-
forceful stop of the whole process tree. This module keeps the phase machine, starting
(with OOM fallbacks, cancel and startup progress) and stopping; around it:
launch_prep.py (program, port, key, environment, storage), gpu_lock.py (one server per GPU
across processes), server_run.py (one generation: process group, log, readiness, state
file), log_files.py, log_follower.py + logwatch.py (what the log says) + log_events.py
(what the supervisor does with it), status.py (the visible state), monitor.py + recovery.py
(after ready: crash, hang, OOM job, cancel, keep-alive), restart_policy.py (the restart
budget), cancel_policy.py (drain or restart after a cancel, weighed against this server's
measured start time), cancel_wait.py (lock waits a cancel ends) and adoption.py (servers an earlier ComfyUI left behind). Nodes and the CLI reach supervisors through registry.py, which this
module never imports.

Secrets stay out of `status()`: the per-launch API key exists only in the child's
environment, `api_key`, and the 0600 state file; never in argv, repr, logs or status.
"""
from __future__ import annotations

import os
import threading
import time
from typing import Any, Callable, Optional

from ..errors import LauncherError
from . import cancel_wait, failures, gpu_lock, launch_prep, logwatch, replicas, timeouts
from .failures import LaunchCancelled, ServerFailure
from .hf_cache import DownloadWatch
from .cancel_policy import CancelPolicy, LaunchClock
from .cancel_wait import ShouldCancel
from .local_config import LocalConfig, default_data_dir
from .log_events import LogEvents
from .logwatch import DenoiseProgress
from .monitor import Monitor
from .multi_host import ServerRole, Watch
from .recovery import Recovery
from .restart_policy import RestartPolicy
from .server_run import RunningServer, ServerRun
from .spec import DEFAULT_VERSION, LaunchSpec
from .status import (FAILED, READY, RESTARTING, STARTING, STOPPED, STOPPING, Status,
                     StatusBoard, StatusCallback)

Fallback = Callable[[LaunchSpec, str], Optional[tuple[LaunchSpec, str]]]


class Supervisor(LogEvents, Recovery):
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
        self.keep_alive_minutes = config.keep_alive_minutes if keep_alive_minutes is None else keep_alive_minutes
        self.hang_timeout_s = float(config.hang_timeout_s or 120.0)
        self._key_mode = api_key
        self._data_dir = config.data_dir or default_data_dir()
        self._lock = threading.RLock()       # guards the fields below
        self._op_lock = threading.RLock()    # one start/restart/stop at a time
        self._board = StatusBoard(self._lock, self.status)
        self._run: Optional[ServerRun] = None   # the current generation, or the last one after a stop
        self._progress = logwatch.ProgressTracker()
        self._gpus: Optional[gpu_lock.GpuLock] = None
        self._restarts = restart_policy or RestartPolicy()
        self.cancel_policy = cancel_policy or CancelPolicy()
        self._launch_clock = LaunchClock()
        self._ready = False
        self._generation = 0
        self._restart_count = 0
        self._server_version: Optional[tuple[int, int]] = None
        self._stop_evt = threading.Event()
        self._monitor = Monitor(self, self._lock)
        self._replicas = replicas.ReplicaWatch([], 1)   # the ready run's replica processes (several only)
        self.role = role or ServerRole()
        self._role_watch: Optional[Watch] = None        # the role's own check of the ready run (multi_host.py)
        self._last_activity = time.time()
        self._last_oom_at = 0.0

    # ---- what others read ----------------------------------------------------------------
    def _from_run(self, name: str) -> Any:
        """An attribute of the current (or last) generation; None before the first start."""
        run = self._run
        return getattr(run, name) if run is not None else None

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
        return self._server_version or DEFAULT_VERSION

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
    def pgid(self) -> Optional[int]:
        return self._from_run("pgid")

    @property
    def replica_pids(self) -> list[int]:
        """The ready server's replica processes, in upstream's replica order ([] for one replica)."""
        return self._replicas.pids()

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
                          requested_fingerprint=self.requested_spec.fingerprint(), restarts=self._restart_count,
                          log_path=self.log_path, **self._board.fields())

    def listen(self, on_status: StatusCallback, replay: bool = True) -> None:
        """Send status changes to `on_status` (only changes; `replay`: the current one now)."""
        self._board.listen(on_status, replay=replay)

    def alive(self) -> bool:
        run = self._run
        return run is not None and run.alive()

    def ready(self) -> bool:
        return self._ready and self.alive()

    def progress(self) -> Optional[DenoiseProgress]:
        """The current (or last) job's denoise progress; None before the first job."""
        return self._progress.current()

    def mark_job_activity(self) -> None:
        """A job is being submitted or polled: the keep-alive idle clock restarts."""
        self._last_activity = time.time()

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

    def _ready_at(self) -> str:
        """Where the ready server is, for the texts after ready (its URL; a joined replica's GPUs and head)."""
        return self.role.ready_at(self.spec, gpu_lock.describe(self.spec.gpus), self.url)

    def _set(self, phase: Optional[str] = None, text: Optional[str] = None) -> None:
        self._board.set(phase, text)

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
                self._handle_request_locked(*pending)   # e.g. a hard-cancel restart not yet begun
            if self.alive() and self._ready:
                self.mark_job_activity()
                self._board.emit(force=on_status is not None)
                return self
            if self.alive():                 # e.g. an adopted server that is not answering
                self._stop_process(graceful=False, timeout=timeouts.REPLACE_STOP_S)
            self._restarts.reset()
            try:
                self._launch_with_fallback(timeout, None, lambda: self._stop_evt.is_set() or asked())
            except LaunchCancelled:
                self._end(STOPPED, "Start cancelled; nothing is left running", timeouts.CANCEL_STOP_S)
                raise
            except BaseException:
                self._end(None, None, timeouts.REPLACE_STOP_S)
                raise
            self._monitor.ensure_running()
            return self
        finally:
            self._op_lock.release()

    def _launch_with_fallback(self, timeout: Optional[float], preferred_port: Optional[int],
                              cancel: ShouldCancel) -> None:
        spec = self.spec
        tried = {spec.fingerprint()}
        port_retried = False
        while True:
            try:
                self._launch_once(spec, timeout, preferred_port, cancel)
                return
            except LaunchCancelled:
                raise
            except ServerFailure as failure:
                if cancel():
                    raise LaunchCancelled(self._board.text) from failure
                self._board.set_error(failure)
                if failure.kind == failures.PORT_IN_USE and not (spec.port or self.config.port) and not port_retried:
                    port_retried, preferred_port = True, None       # lost a race for a free port
                    continue
                if failure.kind in (failures.OOM_LOAD, failures.OOM_JOB) and self.fallback is not None:
                    nxt = self._next_fallback(spec, failures.OOM_LOAD)   # a start that OOMs is a load OOM
                    if nxt is not None and nxt[0].fingerprint() not in tried:
                        spec = nxt[0]
                        preferred_port = self._run.port if self._run is not None else preferred_port
                        tried.add(spec.fingerprint())
                        continue
                    failure = ServerFailure(failure.kind, failure.what, failure.why,
                                            failure.fix + "; automatic fallback has no leaner configuration left",
                                            setting=failure.setting, raw=failure.raw, exit_code=failure.exit_code)
                    self._board.set_error(failure)
                self._set(FAILED, failure.what)
                raise failure

    def _next_fallback(self, spec: LaunchSpec, kind: str) -> Optional[tuple[LaunchSpec, str]]:
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
        self._set(RESTARTING, f"Out of GPU memory; retrying with a leaner configuration: {nxt[1]}")
        return nxt

    def _launch_once(self, spec: LaunchSpec, timeout: Optional[float], preferred_port: Optional[int],
                     cancel: ShouldCancel) -> None:
        """Spawn one server process for `spec` and wait until it is ready; raise on failure."""
        spec.validate()
        executable = launch_prep.server_program(self.config)
        self._claim_gpus(spec)
        launch = launch_prep.prepare(spec, self.config, executable, self._data_dir, self._key_mode,
                                     preferred_port, cancel)
        launch = self.role.adapt(launch)
        if cancel():
            raise LaunchCancelled(self._board.text)
        with self._lock:
            self._generation += 1
            self._ready = False
        self._progress.new_launch()
        self._launch_clock.started()
        self._set(STARTING, self.role.starting_text(spec, gpu_lock.describe(spec.gpus), launch.port))
        run = self.role.spawn(launch, self._generation, self._data_dir, self._on_segment, cancel)
        with self._lock:
            self._run = run
        if self._gpus is not None:
            self._gpus.update(url=run.url)
        run.write_state(self.requested_spec.fingerprint(), ready=False)
        budget = timeouts.startup_budget(spec, launch.env, timeout, self.config.startup_timeout_s)
        download = None if os.path.isdir(os.path.expanduser(spec.model)) else DownloadWatch(spec.model, launch.env,
                                                                                               timeouts.DOWNLOAD_POLL_S)
        run.wait_ready(budget, cancel, lambda: self._show_download(download), lambda: self._board.text,
                       lambda code: self._context(spec, code, ever_ready=False))
        with self._lock:
            self._ready = True
            self._last_activity = time.time()
        self._progress.mark_server_up()
        self._launch_clock.ready()
        self._watch_replicas(spec, run)
        run.write_state(self.requested_spec.fingerprint(), ready=True)
        self._set(READY, self.role.ready_text(spec, run, gpu_lock.describe(spec.gpus)))

    # ---- replicas ----------------------------------------------------------------------
    def _watch_replicas(self, spec: LaunchSpec, run: ServerRun) -> None:
        """Record the ready server's replica processes (replicas.py: upstream never restarts
        a dead one and /health stays 200, so the monitor must look at them itself), and start the
        role's own watch (a head's wedge, a joined replica's head)."""
        self._role_watch = self.role.watch(run, self._progress)
        expected = spec.replicas if self.role.watches_replica_processes else 1
        watch = replicas.ReplicaWatch.find(run.server_pid, expected)
        self._replicas = watch
        if not watch.complete:
            self._board.add_warning(replicas.missing_note(watch))

    def _claim_gpus(self, spec: LaunchSpec) -> None:
        """Hold the GPU lock for `spec`'s GPUs (kept across restarts on the same GPUs)."""
        wanted = launch_prep.gpu_targets(spec, self.config)
        held = self._gpus
        if held is not None and held.held and held.gpus == wanted:
            return
        self._release_gpus()
        self._gpus = gpu_lock.acquire(self.config.gpu_lock_dir, wanted, gpu_lock.Holder.this_process(spec.served_name))

    def _release_gpus(self) -> None:
        held, self._gpus = self._gpus, None
        if held is not None:
            held.release()

    def _context(self, spec: LaunchSpec, exit_code: Optional[int], ever_ready: bool) -> failures.Context:
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
                self._set(STOPPING, "Stopping the server")
            failed = self._board.phase == FAILED and self._board.last_error is not None
            self._end(None if failed else STOPPED, "Stopped", timeout, graceful=True)
        self._monitor.join()

    def _end(self, phase: Optional[str], text: Optional[str], timeout: float, graceful: bool = False) -> None:
        """The server's life is over: no process left, GPUs released, the phase says why."""
        self._stop_process(graceful=graceful, timeout=timeout)
        self._release_gpus()
        if phase is not None:
            self._set(phase, text)

    def _stop_process(self, graceful: bool, timeout: float) -> None:
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
        sup._claim_gpus(running.spec)
        run = ServerRun.adopt(running, sup._data_dir, sup._on_segment)
        with sup._lock:
            sup._run, sup._generation, sup._ready = run, 1, True
        if sup._gpus is not None:
            sup._gpus.update(url=run.url)
        sup._progress.mark_server_up()
        sup._watch_replicas(running.spec, run)
        run.write_state(requested.fingerprint(), ready=True)
        sup._set(READY, f"Ready: reused the server left running at {run.url} ({running.spec.served_name})")
        sup._monitor.ensure_running()
        return sup

