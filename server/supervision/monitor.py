"""The thread that watches a ready server and tells its supervisor what happened.

Once a server is ready, five things can need action, and the monitor notices each of them:
the process exited (a crash after ready), one of its replica processes exited (upstream
neither restarts it nor fails `/health`: replicas.py), `/health` has failed for `hang_timeout_s` while
the process lives (a hung engine), no job has touched it for the keep-alive time (idle),
or a request was queued from another thread (restart after a job ran out of memory, or
after a hard cancel; queued so the slow restart never runs on a log-parsing or node
thread). The monitor decides *when*; the supervisor's hooks decide *what* (restart, give
up, stop). One check every 0.2 s, `/health` every `hang_timeout_s / 4` (0.5-2 s).
"""
from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Optional, Protocol

from ..process import timeouts

if TYPE_CHECKING:
    from ..logs.failures import ServerFailure
    from ..process.server_run import ServerRun


class Watched(Protocol):
    """What the monitor needs from its supervisor."""

    hang_timeout_s: float

    def watched_run(self) -> Optional["ServerRun"]: ...      # the ready run, or None
    def monitor_finished(self) -> bool: ...                  # stopping, or stopped/failed for good
    def on_request(self, reason: str, note: str) -> None: ...
    def on_exit(self, code: int) -> None: ...
    def dead_replica(self) -> Optional["ServerFailure"]: ...   # a replica process gone (replicas.py)
    def on_replica_exit(self, failure: "ServerFailure") -> None: ...
    def on_hang(self, seconds: float) -> None: ...
    def idle_expired(self) -> bool: ...
    def on_idle(self) -> None: ...


class Monitor:
    """One supervisor's watcher thread (started on demand, ends when the server is over)."""

    def __init__(self, watched: Watched, lock: "threading.RLock") -> None:
        self._watched = watched
        self._lock = lock                    # the supervisor's: exit decisions and starts agree
        self._wake = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._pending: Optional[tuple[str, str]] = None

    # ---- requests from other threads -------------------------------------------------------
    def request(self, reason: str, note: str) -> None:
        with self._lock:
            self._pending = (reason, note)
        self._wake.set()

    def take_request(self) -> Optional[tuple[str, str]]:
        with self._lock:
            pending, self._pending = self._pending, None
        return pending

    @property
    def pending(self) -> bool:
        return self._pending is not None

    # ---- the thread ----------------------------------------------------------------------
    def ensure_running(self) -> None:
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return
            self._thread = threading.Thread(target=self._loop, name="vllm-omni-supervisor", daemon=True)
            self._thread.start()

    def wake(self) -> None:
        self._wake.set()

    def join(self) -> None:
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=timeouts.MONITOR_JOIN_S)

    def _should_exit(self) -> bool:
        """Decided under the supervisor's lock, so a concurrent start either sees us gone
        (and starts a new thread) or sees us running (and we keep going)."""
        with self._lock:
            if self._watched.monitor_finished():
                if self._thread is threading.current_thread():
                    self._thread = None
                return True
            return False

    def _loop(self) -> None:
        watched = self._watched
        health_every = max(0.5, min(2.0, watched.hang_timeout_s / 4))
        last_health = 0.0
        failing_since: Optional[float] = None
        while not self._should_exit():
            self._wake.wait(0.2)
            self._wake.clear()
            pending = self.take_request()
            run = watched.watched_run()
            code = run.poll() if run is not None else None
            dead = watched.dead_replica() if run is not None and code is None and pending is None else None
            if pending is not None or code is not None or dead is not None:
                if pending is not None:
                    watched.on_request(*pending)
                elif code is not None:
                    watched.on_exit(code or 0)
                else:
                    watched.on_replica_exit(dead)
                failing_since, last_health = None, time.monotonic()
                continue
            if run is None:
                continue
            now = time.monotonic()
            if now - last_health >= health_every:
                last_health = now
                if run.healthy(min(timeouts.MONITOR_HEALTH_MAX_S, health_every * 2)):
                    failing_since = None
                elif run.alive():
                    failing_since = failing_since or now
                    if now - failing_since >= watched.hang_timeout_s:
                        watched.on_hang(now - failing_since)
                        failing_since, last_health = None, time.monotonic()
                        continue
            if watched.idle_expired():
                watched.on_idle()
