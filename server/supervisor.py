"""The owner of one vLLM-Omni server process: start, watch, restart, stop, report.

One Supervisor per launch spec lives in a module-level registry (`registry.py`; the
functions are re-exported here), so every node of every workflow that asks for the same
server reuses it while it is alive, like SGLang's ComfyUI plugin does. It follows the
SwarmUI pattern for self-started backends: a free port, a fast readiness poll while
watching the child, the log tail kept for the crash report, restarts only for a server
that had been ready (a configuration error must not loop), and a graceful-then-forceful
stop of the whole process tree.

What the user sees is `status()`: a phase, a sentence, and the last error with what to
change. Secrets stay out of it: the per-launch API key exists only in the child's
environment, `api_key`, and the 0600 state file; never in argv, repr, logs or status.
"""
from __future__ import annotations

import collections
import os
import re
import secrets
import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Union

from ..errors import LauncherError
from . import failures, logwatch, probe, process_group, state_file, timeouts
from .failures import ServerFailure
from .local_config import LocalConfig, default_data_dir
from .logwatch import DenoiseProgress
from .spec import DEFAULT_VERSION, LaunchSpec

Fallback = Callable[[LaunchSpec, str], Optional[tuple[LaunchSpec, str]]]
StatusCallback = Callable[["Status"], None]

# Phases shown to the user, in startup order, plus the states around them.
STOPPED, STARTING, DOWNLOADING, LOADING, WARMUP, READY = ("stopped", logwatch.STARTING, logwatch.DOWNLOADING,
                                                          logwatch.LOADING, logwatch.WARMUP, logwatch.READY)
RESTARTING, STOPPING, FAILED = "restarting", "stopping", "failed"
_STARTUP_ORDER = {p: i for i, p in enumerate(logwatch.PHASE_ORDER)}

RESTART_BACKOFF_S = (1.0, 2.0, 5.0, 10.0, 30.0, 60.0)
MAX_RESTARTS = 5                 # within RESTART_WINDOW_S; then give up and say why
RESTART_WINDOW_S = 30 * 60
LOGS_KEPT = 10


@dataclass(frozen=True)
class Status:
    """A snapshot for nodes, the CLI and the status text. Holds no secret."""

    phase: str
    text: str
    ready: bool
    pid: Optional[int]
    port: Optional[int]
    url: Optional[str]
    generation: int
    fingerprint: str                       # the spec the server runs (after any fallback)
    last_error: Optional[str] = None       # what/why/fix of the last failure (raw log tail left out)
    last_error_kind: Optional[str] = None
    fallback_note: Optional[str] = None    # what automatic OOM fallback changed, if anything
    requested_fingerprint: str = ""
    restarts: int = 0
    log_path: Optional[str] = None
    warnings: tuple[str, ...] = ()
    restart_reason: Optional[str] = None   # why the last automatic restart happened (crash, hang, hard cancel)
    updated_at: float = field(default_factory=time.time)


def _short_error(err: LauncherError) -> str:
    return LauncherError(err.what, err.why, err.fix).text()


class Supervisor:
    """Starts and supervises one `vllm serve MODEL --omni` process (and its process group)."""

    def __init__(self, spec: LaunchSpec, config: LocalConfig, fallback: Optional[Fallback] = None, *,
                 keep_alive_minutes: Optional[float] = None, api_key: Union[bool, str] = True) -> None:
        """`api_key`: True = a fresh random key per launch (default), False = no key
        (trusted machine, `serve --no-api-key`), a string = that key (tests/CLI only)."""
        self.requested_spec = spec
        self.spec = spec                     # what runs; differs from requested after an OOM fallback
        self.config = config
        self.fallback = fallback
        self.keep_alive_minutes = config.keep_alive_minutes if keep_alive_minutes is None else keep_alive_minutes
        self.hang_timeout_s = float(getattr(config, "hang_timeout_s", 120.0) or 120.0)
        self._key_mode = api_key
        self._data_dir = config.data_dir or default_data_dir()
        self._lock = threading.RLock()       # guards the fields below
        self._op_lock = threading.RLock()    # one start/restart/stop at a time
        self._changed = threading.Condition(self._lock)
        self._proc: Optional[process_group.ServerProcess] = None
        self._follower: Optional[logwatch.LogFollower] = None
        self._progress = logwatch.ProgressTracker()
        self._phase, self._text = STOPPED, "Not started"
        self._ready = False
        self._ever_ready = False
        self._generation = 0
        self._port: Optional[int] = None
        self._api_key: Optional[str] = None
        self._log_path: Optional[str] = None
        self._last_error: Optional[LauncherError] = None
        self._fallback_notes: list[str] = []
        self._warnings: list[str] = []
        self._server_version: Optional[tuple[int, int]] = None
        self._on_status: Optional[StatusCallback] = None
        self._stop_evt = threading.Event()
        self._wake = threading.Event()       # log says the HTTP server is coming up: poll fast
        self._fast_poll = False
        self._monitor_wake = threading.Event()
        self._monitor: Optional[threading.Thread] = None
        self._pending: Optional[tuple[str, str]] = None   # (reason, note) for the monitor
        self._last_activity = time.time()
        self._restart_times: collections.deque[float] = collections.deque()
        self._restarts = 0
        self._last_oom_at = 0.0
        self._adopted = False
        self._restart_reason: Optional[str] = None

    # ---- public properties -------------------------------------------------------------
    @property
    def url(self) -> Optional[str]:
        port = self._port
        return probe.url_for(self.spec.host, port) if port else None

    @property
    def api_key(self) -> Optional[str]:
        return self._api_key

    @property
    def generation(self) -> int:
        return self._generation

    @property
    def server_version(self) -> tuple[int, int]:
        """(major, minor) of the running vLLM, from its log; the pinned default until seen."""
        return self._server_version or DEFAULT_VERSION

    @property
    def last_error(self) -> Optional[LauncherError]:
        return self._last_error

    @property
    def log_path(self) -> Optional[str]:
        return self._log_path

    @property
    def pgid(self) -> Optional[int]:
        proc = self._proc
        return proc.pgid if proc is not None else None

    def __repr__(self) -> str:
        gpus = ",".join(map(str, self.spec.gpus)) if self.spec.gpus is not None else "all"
        return (f"Supervisor(model={self.spec.model!r}, gpus={gpus}, phase={self._phase!r}, url={self.url!r}, "
                f"generation={self._generation})")

    __str__ = __repr__

    # ---- status ------------------------------------------------------------------------
    def status(self) -> Status:
        with self._lock:
            proc = self._proc
            err = self._last_error
            return Status(
                phase=self._phase, text=self._text, ready=self._ready and proc is not None,
                pid=proc.server_pid if proc is not None else None, port=self._port, url=self.url,
                generation=self._generation, fingerprint=self.spec.fingerprint(),
                last_error=_short_error(err) if err is not None else None,
                last_error_kind=getattr(err, "kind", None) if err is not None else None,
                fallback_note="; ".join(self._fallback_notes) or None,
                requested_fingerprint=self.requested_spec.fingerprint(), restarts=self._restarts,
                log_path=self._log_path, warnings=tuple(self._warnings), restart_reason=self._restart_reason)

    def _set(self, phase: Optional[str] = None, text: Optional[str] = None) -> None:
        with self._lock:
            before = (self._phase, self._text)
            if phase is not None:
                self._phase = phase
            if text is not None:
                self._text = text
            self._changed.notify_all()
            if (self._phase, self._text) == before:
                return
        self._emit()

    def _emit(self) -> None:
        callback = self._on_status
        if callback is None:
            return
        try:
            callback(self.status())
        except Exception:  # noqa: BLE001 - a UI callback must never break supervision
            pass

    def _set_error(self, err: Optional[LauncherError]) -> None:
        with self._lock:
            self._last_error = err

    def alive(self) -> bool:
        proc = self._proc
        return proc is not None and proc.poll() is None

    def ready(self) -> bool:
        return self._ready and self.alive()

    def progress(self) -> Optional[DenoiseProgress]:
        """The current (or last) job's denoise progress; None before the first job."""
        return self._progress.current()

    def mark_job_activity(self) -> None:
        """A job is being submitted or polled: the keep-alive idle clock restarts."""
        self._last_activity = time.time()

    def tail(self, lines: int = 40) -> list[str]:
        follower = self._follower
        if follower is not None:
            return follower.tail(lines)
        return logwatch.read_tail(self._log_path, lines=lines) if self._log_path else []

    def wait_ready(self, timeout: Optional[float] = None) -> bool:
        """Block until ready (True), or stopped/failed/timeout (False)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._changed:
            while True:
                if self._ready and self._proc is not None:
                    return True
                if self._phase in (STOPPED, FAILED) and self._pending is None:
                    return False
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._changed.wait(0.5 if left is None else min(0.5, left))

    # ---- start -------------------------------------------------------------------------
    def start(self, on_status: Optional[StatusCallback] = None, timeout: Optional[float] = None) -> "Supervisor":
        """Start the server (or return at once if it already runs); block until ready.

        Raises LauncherError (a `failures.ServerFailure` with `.kind`) when it cannot start;
        with a fallback set, an out-of-memory start is retried once per leaner spec first.
        """
        if on_status is not None:
            self._on_status = on_status
        with self._op_lock:
            self._stop_evt.clear()
            with self._lock:
                pending, self._pending = self._pending, None
            if pending is not None and self.alive():
                self._handle_request_locked(*pending)   # e.g. a hard-cancel restart not yet begun
            if self.alive() and self._ready:
                self.mark_job_activity()
                self._emit()
                return self
            if self.alive():                 # e.g. an adopted server that is not answering
                self._stop_process(graceful=False, timeout=10)
            self._restart_times.clear()
            self._launch_with_fallback(timeout, preferred_port=None)
            self._ensure_monitor()
        return self

    def _launch_with_fallback(self, timeout: Optional[float], preferred_port: Optional[int]) -> None:
        spec = self.spec
        tried = {spec.fingerprint()}
        port_retried = False
        while True:
            try:
                self._launch_once(spec, timeout, preferred_port)
                return
            except ServerFailure as failure:
                self._set_error(failure)
                if self._stop_evt.is_set():
                    raise
                configured = spec.port or self.config.port
                if failure.kind == failures.PORT_IN_USE and not configured and not port_retried:
                    port_retried, preferred_port = True, None       # lost a race for a free port
                    continue
                if failure.kind in (failures.OOM_LOAD, failures.OOM_JOB) and self.fallback is not None:
                    nxt = self._next_fallback(spec, failures.OOM_LOAD)   # a start that OOMs is a load OOM
                    if nxt is not None and nxt[0].fingerprint() not in tried:
                        spec, preferred_port = nxt[0], self._port or preferred_port
                        tried.add(spec.fingerprint())
                        continue
                    failure = ServerFailure(failure.kind, failure.what, failure.why,
                                            failure.fix + "; automatic fallback has no leaner configuration left",
                                            setting=failure.setting, raw=failure.raw, exit_code=failure.exit_code)
                    self._set_error(failure)
                self._set(FAILED, failure.what)
                raise failure

    def _next_fallback(self, spec: LaunchSpec, kind: str) -> Optional[tuple[LaunchSpec, str]]:
        try:
            nxt = self.fallback(spec, kind) if self.fallback is not None else None
        except Exception:  # noqa: BLE001 - a planner bug must not hide the real failure
            return None
        if nxt is None:
            return None
        new_spec, note = nxt
        try:
            new_spec.validate()
        except LauncherError:
            return None                      # the planner proposed something that cannot start
        with self._lock:
            self.spec = new_spec
            self._fallback_notes.append(note)
        self._set(RESTARTING, f"Out of GPU memory; retrying with a leaner configuration: {note}")
        return nxt

    def _launch_once(self, spec: LaunchSpec, timeout: Optional[float], preferred_port: Optional[int]) -> None:
        """Spawn one server process for `spec` and wait until it is ready; raise on failure."""
        spec.validate()
        executable = self.config.resolved_server_command()
        _check_executable(executable[0])
        configured = spec.port or self.config.port
        host = spec.host
        if configured:
            port = configured
            if not _wait_port_free(host, port, 10.0 if preferred_port == port else 0.0):
                raise failures.port_taken(port)
        elif preferred_port and _wait_port_free(host, preferred_port, 10.0):
            port = preferred_port     # a restart keeps its URL (nodes hold it in their handles)
        else:
            port = probe.free_port(host)
        if self._key_mode is True:
            key: Optional[str] = secrets.token_urlsafe(32)
        else:
            key = self._key_mode or None
        command = spec.build(executable, port, key, trust_remote_code=self.config.trust_remote_code)
        storage = Path(self._data_dir).expanduser() / "storage" / spec.fingerprint()
        shutil.rmtree(storage, ignore_errors=True)     # a new server cannot serve the old jobs' files
        storage.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        env.pop("VLLM_API_KEY", None)
        env.update(self.config.extra_env)
        env.update(command.env)
        env["VLLM_OMNI_SERVER_STORAGE__PATH"] = str(storage)
        env["PYTHONUNBUFFERED"] = "1"
        if key is None:
            env.pop("VLLM_API_KEY", None)

        with self._lock:
            self._generation += 1
            self._ready = False
            self._fast_poll = False
            self._wake.clear()
            self._port, self._api_key = port, key
            self._adopted = False
        self._progress.new_launch()
        log_path, log_fd = self._open_log(spec, command.redacted())
        self._set(STARTING, f"Starting {spec.served_name} on GPUs {_gpus(spec)} (port {port})")
        try:
            proc = process_group.spawn(command.argv, env, log_fd)
        finally:
            os.close(log_fd)
        process_group.find_server_child(proc)
        follower = logwatch.LogFollower(log_path, self._on_segment).start()
        with self._lock:
            self._proc, self._follower, self._log_path = proc, follower, log_path
        self._write_state(spec, command.argv)
        budget = self._startup_budget(spec, env, timeout)
        self._wait_ready(spec, proc, follower, budget)

    def _startup_budget(self, spec: LaunchSpec, env: dict[str, str], timeout: Optional[float]) -> float:
        if timeout is not None:
            return float(timeout)
        if self.config.startup_timeout_s:
            return float(self.config.startup_timeout_s)
        return timeouts.startup_timeout(spec, env)

    def _wait_ready(self, spec: LaunchSpec, proc: process_group.ServerProcess,
                    follower: logwatch.LogFollower, budget: float) -> None:
        host, port, key = spec.host, self._port, self._api_key
        assert port is not None
        deadline = time.monotonic() + budget
        while True:
            if self._stop_evt.is_set():
                self._stop_process(graceful=False, timeout=10)
                raise ServerFailure("stopped", "The server start was cancelled", "a stop was requested while it "
                                    "was starting", "start it again when needed")
            code = proc.poll()
            if code is not None:
                follower.drain()
                tail = self._redact(follower.tail(200))
                self._stop_process(graceful=False, timeout=10)
                raise failures.classify(tail, self._context(spec, exit_code=code, ever_ready=False))
            if probe.health(host, port, timeout=1.0) == 200:
                names = probe.served_models(host, port, key, timeout=2.0)
                if names is not None and spec.served_name in names:
                    break
            if time.monotonic() > deadline:
                follower.drain()
                tail = self._redact(follower.tail(200))
                phase_text = self._text
                self._stop_process(graceful=False, timeout=10)
                hint = "'startup_timeout_s' in the launcher config or VLLM_OMNI_LAUNCHER_STARTUP_TIMEOUT_S"
                raise failures.startup_timeout(budget, phase_text, tail, hint)
            self._wake.wait(0.02 if self._fast_poll else 0.1)
        if proc.server_pid is None:
            process_group.find_server_child(proc, timeout=5.0)
        with self._lock:
            self._ready = True
            self._ever_ready = True
            self._last_activity = time.time()
        self._progress.mark_server_up()
        self._write_state(spec, None, ready=True)
        self._set(READY, f"Ready: {spec.served_name} at {self.url} (GPUs {_gpus(spec)})")

    def _context(self, spec: LaunchSpec, exit_code: Optional[int], ever_ready: bool) -> failures.Context:
        return failures.Context(model=spec.model, gpus=_gpus(spec), world_size=spec.parallel.world_size,
                                port=self._port, port_configured=bool(spec.port or self.config.port),
                                ever_ready=ever_ready, exit_code=exit_code)

    def _redact(self, lines: list[str]) -> list[str]:
        key = self._api_key
        return [line.replace(key, "***") for line in lines] if key else lines

    # ---- log events --------------------------------------------------------------------
    def _on_segment(self, text: str, ends_line: bool) -> None:
        if self._progress.feed(text):
            self._last_activity = time.time()
            if logwatch.bar_text(text) == logwatch.strip_prefix(text).rstrip():
                return                         # a pure redraw; else a log line is glued after it
        if logwatch.is_server_up(text):
            self._fast_poll = True
            self._wake.set()
        version = logwatch.server_version(text)
        if version is not None:
            self._server_version = version
        if logwatch.is_version_mismatch(text):
            note = ("vLLM and vLLM-Omni in the server environment have different major/minor versions; "
                    "re-create it with server/create_server_env.sh")
            if note not in self._warnings:
                self._warnings.append(note)
        if self._ready:
            if logwatch.is_oom_line(text):
                self._on_job_oom(text)
            return
        change = logwatch.parse_phase(text)
        if change is None:
            return
        with self._lock:
            current = _STARTUP_ORDER.get(self._phase)
            if current is None:              # stopping, failed, ...: the log no longer drives the phase
                return
            wanted = _STARTUP_ORDER[change.phase] if change.phase else current
            if wanted < current:             # phases only move forward during one start
                return
            phase = change.phase or self._phase
        self._set(phase, change.text)

    def _on_job_oom(self, text: str) -> None:
        now = time.monotonic()
        if now - self._last_oom_at < 5.0:       # one traceback prints several OOM lines
            return
        self._last_oom_at = now
        self._progress.abort_current()
        tail = self._redact(self.tail(40))
        if text not in tail:
            tail.append(text)
        err = failures.oom_job_error(tail, self._context(self.spec, None, True))
        self._set_error(err)
        if self.fallback is not None:
            self._request("oom_job", "a job ran out of GPU memory")
        else:
            self._set(None, f"Ready at {self.url}; the last job ran out of GPU memory ({err.fix})")

    # ---- monitoring after ready ---------------------------------------------------------
    def _ensure_monitor(self) -> None:
        with self._lock:
            if self._monitor is not None and self._monitor.is_alive():
                return
            self._monitor = threading.Thread(target=self._monitor_loop, name="vllm-omni-supervisor", daemon=True)
            self._monitor.start()

    def _monitor_should_exit(self) -> bool:
        """Decided under the lock, so a concurrent start() either sees us gone or keeps us."""
        with self._lock:
            if self._stop_evt.is_set() or (self._phase in (STOPPED, FAILED) and self._pending is None):
                if self._monitor is threading.current_thread():
                    self._monitor = None
                return True
            return False

    def _request(self, reason: str, note: str) -> None:
        with self._lock:
            self._pending = (reason, note)
        self._monitor_wake.set()

    def _monitor_loop(self) -> None:
        health_every = max(0.5, min(2.0, self.hang_timeout_s / 4))
        last_health = 0.0
        failing_since: Optional[float] = None
        while not self._monitor_should_exit():
            self._monitor_wake.wait(0.2)
            self._monitor_wake.clear()
            if self._stop_evt.is_set():
                continue
            with self._lock:
                pending, self._pending = self._pending, None
                proc = self._proc
            if pending is not None:
                self._handle_request(*pending)
                failing_since, last_health = None, time.monotonic()
                continue
            if proc is None or not self._ready:
                continue
            code = proc.poll()
            if code is not None:
                self._handle_exit(code)
                failing_since, last_health = None, time.monotonic()
                continue
            now = time.monotonic()
            if now - last_health >= health_every:
                last_health = now
                ok = probe.health(self.spec.host, self._port or 0, timeout=min(5.0, health_every * 2)) == 200
                if ok:
                    failing_since = None
                elif proc.poll() is None:
                    failing_since = failing_since or now
                    if now - failing_since >= self.hang_timeout_s:
                        err = failures.hung(now - failing_since, self._redact(self.tail(40)))
                        self._set_error(err)
                        self._restart_after(err, "hung")
                        failing_since, last_health = None, time.monotonic()
                        continue
            if self._idle_expired():
                self._idle_stop()

    def _idle_expired(self) -> bool:
        minutes = self.keep_alive_minutes or 0
        if minutes <= 0:
            return False
        last = max(self._last_activity, self._progress.last_seen)
        cur = self._progress.current()
        if cur is not None and not cur.done and not cur.aborted:
            return False                     # a denoise is running right now
        return time.time() - last >= minutes * 60

    def _idle_stop(self) -> None:
        with self._op_lock:
            if not self._idle_expired() or self._stop_evt.is_set():
                return
            minutes = self.keep_alive_minutes
            self._stop_process(graceful=True, timeout=30)
            self._set(STOPPED, f"Stopped after {minutes:g} idle minute(s) to free the GPUs; "
                               "the next job starts it again")

    def _handle_exit(self, code: int) -> bool:
        """The server died after being ready. Restart (True) or give up (False)."""
        follower = self._follower
        if follower is not None:
            follower.drain()
        tail = self._redact(self.tail(200))
        failure = failures.classify(tail, self._context(self.spec, exit_code=code, ever_ready=True))
        self._set_error(failure)
        return self._restart_after(failure, "crash")

    def _restart_after(self, failure: ServerFailure, reason: str) -> bool:
        with self._op_lock:
            return self._restart_after_locked(failure, reason)

    def _restart_after_locked(self, failure: ServerFailure, reason: str) -> bool:
        if self._stop_evt.is_set():
            return False
        now = time.monotonic()
        while self._restart_times and now - self._restart_times[0] > RESTART_WINDOW_S:
            self._restart_times.popleft()
        if len(self._restart_times) >= MAX_RESTARTS:
            self._stop_process(graceful=False, timeout=10)
            self._set(FAILED, f"Gave up after {len(self._restart_times)} restarts in "
                              f"{RESTART_WINDOW_S // 60} minutes: {failure.what}")
            return False
        delay = RESTART_BACKOFF_S[min(len(self._restart_times), len(RESTART_BACKOFF_S) - 1)]
        self._restart_times.append(now)
        what = "stopped answering" if reason == "hung" else failure.what.rstrip(".")
        with self._lock:
            self._restart_reason = f"{failure.what.rstrip('.')} ({failure.kind})"
        self._set(RESTARTING, f"{what}; restarting in {delay:g} s (restart {len(self._restart_times)} "
                              f"of at most {MAX_RESTARTS})")
        self._stop_process(graceful=False, timeout=10)
        if failure.kind == failures.OOM_JOB and self.fallback is not None:
            self._next_fallback(self.spec, failures.OOM_JOB)
        if self._stop_evt.wait(delay):
            return False
        return self._relaunch(f"Restarted after: {what}")

    def _relaunch(self, ready_text: str) -> bool:
        with self._op_lock:
            if self._stop_evt.is_set():
                return False
            previous_port = self._port
            try:
                self._stop_process(graceful=False, timeout=10)
                self._launch_with_fallback(None, preferred_port=previous_port)
            except ServerFailure as failure:
                self._set_error(failure)
                if self._stop_evt.is_set():
                    return False
                if failure.kind in failures.PERMANENT - {failures.OOM_LOAD}:
                    self._set(FAILED, failure.what)
                    return False
                return self._restart_after(failure, "crash")
            except LauncherError as err:
                self._set_error(err)
                self._set(FAILED, err.what)
                return False
            with self._lock:
                self._restarts += 1
            self._set(READY, f"{ready_text}. Ready at {self.url} (generation {self._generation})")
            return True

    def _handle_request(self, reason: str, note: str) -> None:
        with self._op_lock:
            if self._stop_evt.is_set():
                return
            self._handle_request_locked(reason, note)

    def _handle_request_locked(self, reason: str, note: str) -> None:
        if reason == "oom_job":
            if self._next_fallback(self.spec, failures.OOM_JOB) is None:
                self._set(None, f"Ready at {self.url}; the last job ran out of GPU memory and the fallback "
                                "has no leaner configuration left")
                return
            with self._lock:
                self._restart_reason = f"a job ran out of GPU memory; fallback: {self._fallback_notes[-1]}"
            self._set(RESTARTING, f"Restarting with the leaner configuration: {self._fallback_notes[-1]}")
            self._relaunch(f"Restarted with: {self._fallback_notes[-1]}")
        elif reason == "hard_cancel":
            self._set(RESTARTING, note)
            with self._lock:
                self._restart_times.append(time.monotonic())
            self._relaunch(note.split(";")[0])

    # ---- hard cancel -------------------------------------------------------------------
    def hard_cancel(self, job_id: str, client_delete: Union[Callable[[], object], str, None] = None,
                    grace_s: float = 15.0, wait: bool = False) -> bool:
        """Make sure a cancelled job stops using the GPU; True when the server was restarted.

        Upstream DELETE removes the job record but cannot stop a running Wan denoise, so the
        GPU stays busy for the rest of the job. The caller has usually DELETEd the job
        already; `client_delete` (a callable, or the server base URL for a DELETE with our
        key) is sent first when given. If the denoise run in progress neither finishes nor
        ends within `grace_s`, the server is restarted (same port when possible) and the
        status says so. `wait=True` blocks until the restarted server is ready.
        """
        if callable(client_delete):
            try:
                client_delete()
            except Exception:  # noqa: BLE001 - best effort; the restart below is the real fix
                pass
        elif isinstance(client_delete, str):
            probe.delete_job(client_delete, job_id, self._api_key)
        snap = self._progress.current()
        if snap is None or snap.done or snap.aborted or not self.alive():
            return False
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            cur = self._progress.current()
            if cur is None or cur.run_id != snap.run_id or cur.done or cur.aborted or not self.alive():
                return False
            if self._stop_evt.wait(0.1):
                return False
        cur = self._progress.current()
        if cur is None or cur.run_id != snap.run_id or cur.done or cur.aborted:
            return False
        note = (f"Cancelled job {job_id} was still running on the GPU after {grace_s:g} s (Wan cannot stop "
                f"mid-denoise, step {cur.step}/{cur.total}); restarting the server to free the GPU")
        self._progress.abort_current()
        with self._lock:
            self._ready = False
            self._restart_reason = note
        self._request("hard_cancel", note)
        self._set(RESTARTING, note)
        if wait:
            self.wait_ready()
        return True

    # ---- stop --------------------------------------------------------------------------
    def request_stop(self) -> None:
        """Ask a start or restart in progress to give up soon; safe from signal handlers."""
        self._stop_evt.set()
        self._monitor_wake.set()
        self._wake.set()

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the server's whole process group (SIGINT, SIGTERM, SIGKILL) and verify it."""
        self._stop_evt.set()
        self._monitor_wake.set()
        self._wake.set()
        with self._op_lock:
            if self._proc is not None:
                self._set(STOPPING, "Stopping the server")
            self._stop_process(graceful=True, timeout=timeout)
            if self._phase != FAILED or self._last_error is None:
                self._set(STOPPED, "Stopped")
        monitor = self._monitor
        if monitor is not None and monitor is not threading.current_thread():
            monitor.join(timeout=5)

    def _stop_process(self, graceful: bool, timeout: float) -> None:
        with self._lock:
            proc, follower = self._proc, self._follower
            self._proc, self._ready = None, False
        if proc is None:
            return
        left = proc.stop(timeout=timeout, graceful=graceful)
        if follower is not None:
            follower.stop()
            with self._lock:
                self._follower = None
        self._progress.abort_current()
        state_file.remove(self._data_dir, proc.pgid)
        if left:
            self._set_error(LauncherError(
                f"Server processes {left} did not exit after SIGKILL",
                "they are stuck in the kernel (usually a GPU driver call) and still hold GPU memory",
                "check `nvidia-smi`; if they stay, the GPU driver needs attention (or a reboot)"))

    # ---- files -------------------------------------------------------------------------
    def _open_log(self, spec: LaunchSpec, shown: dict) -> tuple[str, int]:
        logs = Path(self._data_dir).expanduser() / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        in_use = {s.log_path for s in all_servers() if s.alive()}
        existing = sorted((p for p in logs.glob("*.log") if str(p) not in in_use), key=_mtime)
        for old in existing[:max(0, len(existing) - (LOGS_KEPT - 1))]:
            for victim in (old, old.with_name(old.name + ".1")):
                try:
                    victim.unlink()
                except OSError:
                    pass
        name = re.sub(r"[^A-Za-z0-9_.-]+", "_", spec.served_name.strip("/").split("/")[-1])[:60]
        stamp = time.strftime("%Y%m%d-%H%M%S")
        path = logs / f"{name}-{spec.fingerprint()}-{stamp}-g{self._generation}.log"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        header = (f"[vllm-omni-launcher] {time.strftime('%Y-%m-%d %H:%M:%S')} generation {self._generation}: "
                  f"{' '.join(shown['argv'])} (env: "
                  f"{', '.join(f'{k}={v}' for k, v in shown['env'].items())})\n")
        os.write(fd, header.encode())
        return str(path), fd

    def _write_state(self, spec: LaunchSpec, argv: Optional[list[str]], ready: bool = False) -> None:
        proc = self._proc
        if proc is None:
            return
        if argv is None:
            argv = getattr(self, "_argv", [])
        self._argv = list(argv)
        me = os.getpid()
        state = state_file.ServerState(
            pgid=proc.pgid, leader_create_time=proc.leader_create_time, server_pid=proc.server_pid,
            server_create_time=proc.server_create_time, argv=list(argv), host=spec.host, port=self._port or 0,
            fingerprint=spec.fingerprint(), requested_fingerprint=self.requested_spec.fingerprint(),
            spec=spec.to_dict(), api_key=self._api_key, log_path=self._log_path or "",
            storage_path=str(Path(self._data_dir).expanduser() / "storage" / spec.fingerprint()),
            owner_pid=me, owner_create_time=process_group.create_time(me), started_at=time.time(), ready=ready)
        try:
            state_file.write(self._data_dir, state)
        except OSError:
            pass

    # ---- adoption (a server left behind by an earlier ComfyUI) --------------------------
    @classmethod
    def adopt(cls, state: state_file.ServerState, config: LocalConfig, requested: LaunchSpec,
              fallback: Optional[Fallback] = None, keep_alive_minutes: Optional[float] = None) -> "Supervisor":
        """Take over a verified, healthy server described by `state` (see registry)."""
        spec = LaunchSpec.from_dict(state.spec)
        sup = cls(requested, config, fallback, keep_alive_minutes=keep_alive_minutes)
        sup.spec = spec
        proc = process_group.ServerProcess(pgid=state.pgid, leader_create_time=state.leader_create_time,
                                           server_pid=state.server_pid, server_create_time=state.server_create_time,
                                           adopted=True)
        process_group.guard_adopted(proc)
        offset = 0
        try:
            offset = os.path.getsize(state.log_path)
        except OSError:
            pass
        with sup._lock:
            sup._proc = proc
            sup._port, sup._api_key, sup._log_path = state.port, state.api_key, state.log_path or None
            sup._generation, sup._ready, sup._ever_ready, sup._adopted = 1, True, True, True
            sup._argv = list(state.argv)
        sup._progress.mark_server_up()
        if state.log_path:
            sup._follower = logwatch.LogFollower(state.log_path, sup._on_segment, offset=offset).start()
            for line in logwatch.read_tail(state.log_path, lines=40):
                sup._follower._lines.append(line)
        sup._write_state(spec, None, ready=True)
        sup._set(READY, f"Ready: reused the server left running at {sup.url} ({spec.served_name})")
        sup._ensure_monitor()
        return sup


def _gpus(spec: LaunchSpec) -> str:
    return ",".join(map(str, spec.gpus)) if spec.gpus is not None else "all visible"


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def _wait_port_free(host: str, port: int, seconds: float) -> bool:
    """A killed server's listening socket is closed by the kernel a moment after the process
    is gone (deferred file release), so give the old port a few seconds before giving it up."""
    deadline = time.monotonic() + seconds
    while True:
        if probe.port_available(host, port):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)


def _check_executable(program: str) -> None:
    if os.sep in program:
        if not (os.path.isfile(program) and os.access(program, os.X_OK)):
            raise failures.executable_missing(program, "the file does not exist or is not executable")
    elif shutil.which(program) is None:
        raise failures.executable_missing(program, "it is not on PATH")


# The registry functions the node layer calls: supervisor.get_or_start(...), etc.
from .registry import (all_servers, find, get_or_start, install_exit_handlers, stop,  # noqa: E402
                       stop_all)

__all__ = ["Supervisor", "Status", "DenoiseProgress", "get_or_start", "find", "stop", "stop_all",
           "all_servers", "install_exit_handlers"]
