"""One server process from spawn to exit: its port, key, log, readiness and state file.

A Supervisor lives across generations (restarts, OOM fallbacks); each generation is one
ServerRun: the process group under the watchdog (process_group.py), the log file it writes
and the follower reading it, the port and key it was started with, and the state file that
lets a later ComfyUI adopt it. A run is either spawned from a prepared launch
(launch_prep.py) or taken over from a state file (adoption.py builds the RunningServer).

Readiness: vLLM-Omni binds its port early but serves nothing until the model is loaded and
warm, so ready means `/health` answers 200 and `/v1/models` lists the served name. The wait
polls every 0.1 s (0.02 s once the log says the HTTP server is coming up) and checks the
child, the deadline and the cancel request on every round. `/v1/models` carries the launch key,
so before it the listener on the port must be proved to be the server's own process group
(port_owner.py; once per generation: a socket proved ours is known by its inode); another
program there ends the launch with its name, and is sent nothing keyed.
"""
from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

from ...errors.config_names import env_var
from ..launch.spec import LaunchSpec
from ..logs import failures
from ..logs.failures import LaunchCancelled
from ..logs.log_follower import LogFollower, read_tail
from ..storage import state_file
from . import log_files, port_owner, probe, process_group, timeouts
from .cancel_wait import ShouldCancel
from .launch_prep import Launch

OnSegment = Callable[[str, bool], None]


@dataclass(frozen=True)
class RunningServer:
    """A server this process did not start but may supervise (adoption.py proved it is ours)."""

    process: process_group.ServerProcess
    spec: LaunchSpec
    port: int
    log_path: str
    argv: list[str]
    api_key: Optional[str] = field(default=None, repr=False)


class ServerRun:
    """One generation of a server: a live process group until `stop()`."""

    def __init__(self, spec: LaunchSpec, proc: process_group.ServerProcess, port: int, api_key: Optional[str],
                 log_path: str, argv: list[str], storage: str, follower: Optional[LogFollower], data_dir: str) -> None:
        self.spec, self.port, self.log_path, self.argv, self.storage = spec, port, log_path, argv, storage
        self._api_key = api_key
        self._proc: Optional[process_group.ServerProcess] = proc
        self._follower = follower
        self._data_dir = data_dir
        self._fast = False
        self._wake = threading.Event()
        self._own_listeners: frozenset[int] = frozenset()   # listening socket inodes proved ours

    @classmethod
    def spawn(cls, launch: Launch, generation: int, data_dir: str, on_segment: OnSegment,
              cancel: ShouldCancel) -> "ServerRun":
        """Start `launch` under the watchdog, its output appended to a new log file."""
        log_path, log_fd = log_files.open_log(data_dir, launch.spec, generation, launch.command.redacted())
        try:
            proc = process_group.spawn(launch.command.argv, launch.env, log_fd)
        finally:
            os.close(log_fd)
        process_group.find_server_child(proc, timeouts.FIND_SERVER_CHILD_S, cancel)
        follower = LogFollower(log_path, on_segment).start()
        return cls(launch.spec, proc, launch.port, launch.api_key, log_path, list(launch.command.argv),
                   str(launch.storage), follower, data_dir)

    @classmethod
    def adopt(cls, running: RunningServer, data_dir: str, on_segment: OnSegment) -> "ServerRun":
        """Take over `running`: a guard watchdog binds its life to ours; its log is followed
        from where it is now."""
        process_group.guard_adopted(running.process)
        follower = LogFollower.resume(running.log_path, on_segment).start() if running.log_path else None
        storage = os.path.join(os.path.expanduser(data_dir), "storage", running.spec.fingerprint())
        return cls(running.spec, running.process, running.port, running.api_key, running.log_path,
                   list(running.argv), storage, follower, data_dir)

    def __repr__(self) -> str:
        return f"ServerRun(url={self.url!r}, pgid={self.pgid}, running={self.running})"

    # ---- reading -------------------------------------------------------------------------
    @property
    def api_key(self) -> Optional[str]:
        return self._api_key

    @property
    def url(self) -> str:
        return probe.url_for(self.spec.host, self.port)

    @property
    def running(self) -> bool:
        """Not stopped by us (it may still have died on its own: see `alive`)."""
        return self._proc is not None

    @property
    def pgid(self) -> Optional[int]:
        proc = self._proc
        return proc.pgid if proc is not None else None

    @property
    def server_pid(self) -> Optional[int]:
        proc = self._proc
        return proc.server_pid if proc is not None else None

    def poll(self) -> Optional[int]:
        """None while the server process lives; its exit code once it is gone (or stopped)."""
        proc = self._proc
        return proc.poll() if proc is not None else -1

    def alive(self) -> bool:
        return self.poll() is None

    def tail(self, lines: int = 40) -> list[str]:
        """The log's last display lines, with the run's API key masked."""
        follower = self._follower
        found = follower.tail(lines) if follower is not None else read_tail(self.log_path, lines=lines)
        return self.redact(found)

    def nudge_log(self) -> None:
        """Have the log's follower read now (its own thread): a line a client waits for is due."""
        if self._follower is not None:
            self._follower.nudge()

    def drain(self) -> None:
        """Parse everything the server has written so far (before reading the tail)."""
        if self._follower is not None:
            self._follower.drain()

    def redact(self, lines: list[str]) -> list[str]:
        key = self._api_key
        return [line.replace(key, "***") for line in lines] if key else lines

    # ---- readiness -----------------------------------------------------------------------
    def hurry(self) -> None:
        """The log says the HTTP server is coming up: poll fast from now on."""
        self._fast = True
        self._wake.set()

    def healthy(self, timeout: float) -> bool:
        return probe.health(self.spec.host, self.port, timeout=timeout) == 200

    def answers(self) -> bool:
        if not self.healthy(timeouts.HEALTH_PROBE_S) or not self.listener_is_ours():
            return False
        names = probe.served_models(self.spec.host, self.port, self._api_key, timeout=timeouts.MODELS_PROBE_S)
        return names is not None and self.spec.served_name in names

    def listener_is_ours(self) -> bool:
        """Whether what listens on the port is this run's process group (False: nothing listens
        yet). Raises port_owner's ServerFailure, naming the holder, when another program does."""
        proc = self._proc
        if proc is None:
            return False
        self._own_listeners = port_owner.check_listener(probe.connect_host(self.spec.host), self.port, proc.pgid,
                                                        self._own_listeners)
        return bool(self._own_listeners)

    def wait_ready(self, budget: float, cancel: ShouldCancel, tick: Callable[[], None],
                   phase_text: Callable[[], str], context: Callable[[Optional[int]], failures.Context]) -> None:
        """Return once the server answers; else stop it and raise: LaunchCancelled when
        `cancel()` turns true (the group is gone within 2 s), the classified failure when it
        exits, a timeout failure after `budget` seconds. `tick` runs on every round."""
        deadline = time.monotonic() + budget
        while True:
            if cancel():
                self.stop(graceful=False, timeout=timeouts.CANCEL_STOP_S)
                raise LaunchCancelled(phase_text())
            code = self.poll()
            if code is not None or time.monotonic() > deadline:
                self.drain()
                tail, text = self.tail(200), phase_text()
                self.stop(graceful=False, timeout=timeouts.REPLACE_STOP_S)
                if code is not None:
                    raise failures.classify(tail, context(code))
                hint = f"'startup_timeout_s' in the launcher config or {env_var('startup_timeout_s')}"
                raise failures.startup_timeout(budget, text, tail, hint, log_path=self.log_path)
            try:
                if self.answers():
                    break
            except failures.ServerFailure:       # another program holds the port: stop ours, say so
                self.stop(graceful=False, timeout=timeouts.REPLACE_STOP_S)
                raise
            tick()
            self._wake.wait(timeouts.FAST_POLL_S if self._fast else timeouts.READY_POLL_S)
        proc = self._proc
        if proc is not None and proc.server_pid is None:
            process_group.find_server_child(proc, timeout=timeouts.READY_CHILD_S)

    # ---- records and stopping ------------------------------------------------------------
    def write_state(self, requested_fingerprint: str, ready: bool) -> None:
        """Record this run in its 0600 state file (what a later ComfyUI needs to adopt it)."""
        proc = self._proc
        if proc is None:
            return
        me = os.getpid()
        state = state_file.ServerState(
            pgid=proc.pgid, leader_create_time=proc.leader_create_time, server_pid=proc.server_pid,
            server_create_time=proc.server_create_time, argv=list(self.argv), host=self.spec.host, port=self.port,
            fingerprint=self.spec.fingerprint(), requested_fingerprint=requested_fingerprint,
            spec=self.spec.to_dict(), api_key=self._api_key, log_path=self.log_path, storage_path=self.storage,
            owner_pid=me, owner_create_time=process_group.create_time(me), started_at=time.time(), ready=ready)
        try:
            state_file.write(self._data_dir, state)
        except OSError:
            pass

    def stop(self, graceful: bool, timeout: float) -> list[int]:
        """Stop the whole process group and forget its state file; the pids still alive
        afterwards (empty on success). Stopping a stopped run does nothing."""
        self._wake.set()
        proc, self._proc = self._proc, None
        if proc is None:
            return []
        left = proc.stop(timeout=timeout, graceful=graceful)
        follower, self._follower = self._follower, None
        if follower is not None:
            follower.stop()
        state_file.remove(self._data_dir, proc.pgid)
        return left
