"""Starting one generation of a server: spawn it for a spec, wait until it is ready, and try
again after a failure that another try can fix.

A start is tried again once on another free port when it lost the race for the one it picked
(and no port is configured), and with the fallback's leaner spec after it ran out of GPU memory,
never twice with the same spec; any other failure ends the start with that failure as the
status. While it starts, the log's startup lines and the weights' download are the progress
(log_events.py); a cancel ends it with LaunchCancelled. The generation's state (its number, its
run, the spec that runs) is the supervisor's, changed through the `Generations` protocol.
"""
from __future__ import annotations

import os
from typing import Any, Callable, Optional, Protocol

from ..config.local_config import LocalConfig
from ..launch.hf_cache import DownloadWatch
from ..launch.spec import LaunchSpec
from ..logs import failures
from ..logs.failures import LaunchCancelled, ServerFailure
from ..logs.logwatch import ProgressTracker
from ..process import gpu_lock, launch_prep, timeouts
from ..process.cancel_wait import ShouldCancel
from ..process.server_run import ServerRun
from .cancel_policy import LaunchClock
from .log_events import LogEvents
from .multi_host import ServerRole
from .status import FAILED, STARTING, StatusBoard


class Generations(Protocol):
    """The supervisor's side of a start."""

    spec: LaunchSpec                 # what runs (a step down changes it)
    requested_spec: LaunchSpec
    fallback: Optional[Callable[..., Any]]

    @property
    def run(self) -> Optional[ServerRun]: ...
    def begin_generation(self) -> int: ...              # the next generation's number; not ready
    def spawned(self, run: ServerRun) -> None: ...      # it is the current generation now
    def step_down(self, spec: LaunchSpec, kind: str) -> Optional[tuple[LaunchSpec, str]]: ...
    def failure_context(self, spec: LaunchSpec, exit_code: Optional[int], ever_ready: bool) -> failures.Context: ...
    def now_ready(self, spec: LaunchSpec, run: ServerRun, text: str) -> None: ...


class Starter:
    """Brings up generations of one supervisor's server. `key_mode`: launch_prep.KeyMode;
    `gpus`: the supervisor's claim, kept across generations on the same GPUs."""

    def __init__(self, owner: Generations, board: StatusBoard, progress: ProgressTracker, log: LogEvents,
                 launch_clock: LaunchClock, gpus: gpu_lock.GpuClaim, *, config: LocalConfig, role: ServerRole,
                 key_mode: launch_prep.KeyMode, data_dir: str) -> None:
        self._owner = owner
        self._board = board
        self._progress = progress
        self._log = log
        self._launch_clock = launch_clock
        self._gpus = gpus
        self._config = config
        self._role = role
        self._key_mode = key_mode
        self._data_dir = data_dir

    def start(self, timeout: Optional[float], preferred_port: Optional[int], cancel: ShouldCancel) -> None:
        """Start the owner's spec (or a leaner one) until one is ready; raise the failure otherwise."""
        owner = self._owner
        spec = owner.spec
        tried = {spec.fingerprint()}
        port_retried = False
        while True:
            try:
                self._once(spec, timeout, preferred_port, cancel)
                return
            except LaunchCancelled:
                raise
            except ServerFailure as failure:
                if cancel():
                    raise LaunchCancelled(self._board.text) from failure
                self._board.set_error(failure)
                if failure.kind == failures.PORT_IN_USE and not (spec.port or self._config.port) and not port_retried:
                    port_retried, preferred_port = True, None       # lost a race for a free port
                    continue
                if failure.kind in (failures.OOM_LOAD, failures.OOM_JOB) and owner.fallback is not None:
                    nxt = owner.step_down(spec, failures.OOM_LOAD)   # a start that OOMs is a load OOM
                    if nxt is not None and nxt[0].fingerprint() not in tried:
                        spec = nxt[0]
                        preferred_port = owner.run.port if owner.run is not None else preferred_port
                        tried.add(spec.fingerprint())
                        continue
                    failure = ServerFailure(failure.kind, failure.what, failure.why,
                                            failure.fix + "; automatic fallback has no leaner configuration left",
                                            setting=failure.setting, raw=failure.raw, exit_code=failure.exit_code)
                    self._board.set_error(failure)
                self._board.set(FAILED, failure.what)
                raise failure

    def _once(self, spec: LaunchSpec, timeout: Optional[float], preferred_port: Optional[int],
              cancel: ShouldCancel) -> None:
        """Spawn one server process for `spec` and wait until it is ready; raise on failure."""
        owner, config, role = self._owner, self._config, self._role
        spec.validate()
        executable = launch_prep.server_program(config)
        self._gpus.claim(launch_prep.gpu_targets(spec, config), spec.served_name)
        launch = launch_prep.prepare(spec, config, executable, self._data_dir, self._key_mode, preferred_port, cancel)
        launch = role.adapt(launch)
        if cancel():
            raise LaunchCancelled(self._board.text)
        generation = owner.begin_generation()
        self._progress.new_launch()
        self._launch_clock.started()
        self._board.set(STARTING, role.starting_text(spec, gpu_lock.describe(spec.gpus), launch.port))
        run = role.spawn(launch, generation, self._data_dir, self._log.on_segment, cancel)
        owner.spawned(run)
        self._gpus.show_url(run.url)
        run.write_state(owner.requested_spec.fingerprint(), ready=False)
        budget = timeouts.startup_budget(spec, launch.env, timeout, config.startup_timeout_s)
        download = None if os.path.isdir(os.path.expanduser(spec.model)) else DownloadWatch(spec.model, launch.env,
                                                                                               timeouts.DOWNLOAD_POLL_S)
        run.wait_ready(budget, cancel, lambda: self._log.show_download(download), lambda: self._board.text,
                       lambda code: owner.failure_context(spec, code, ever_ready=False))
        self._launch_clock.ready()
        owner.now_ready(spec, run, role.ready_text(spec, run, gpu_lock.describe(spec.gpus)))
