"""Starter (server/supervision/starting.py) on its own: one start of a server, from a spec to ready,
and the tries a failure allows. A start that lost the race for its free port tries once more on
another; one that ran out of GPU memory tries the fallback's leaner spec on the same port, never the
same spec twice; anything else, or a second failure of the same kind, ends the start as its status;
a cancel ends it as cancelled. Everything before the process is real (spec check, port, key, GPU
lock, storage folder); the server process is faked: the role's spawn returns a run that is ready or
raises the failure planned for it."""
from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import Any, Callable, Optional

import pytest

from vllm_omni_launcher.server.config.local_config import LocalConfig
from vllm_omni_launcher.server.launch.spec import LaunchSpec, MemoryConfig
from vllm_omni_launcher.server.logs import failures
from vllm_omni_launcher.server.logs.failures import LaunchCancelled, ServerFailure
from vllm_omni_launcher.server.logs.logwatch import ProgressTracker
from vllm_omni_launcher.server.process import gpu_lock, probe
from vllm_omni_launcher.server.process.launch_prep import Launch
from vllm_omni_launcher.server.supervision.cancel_policy import LaunchClock
from vllm_omni_launcher.server.supervision.log_events import LogEvents
from vllm_omni_launcher.server.supervision.multi_host import ServerRole
from vllm_omni_launcher.server.supervision.starting import Starter
from vllm_omni_launcher.server.supervision.status import FAILED, STARTING, StatusBoard

MODEL = "Wan-AI/Wan2.2-TI2V-5B-Diffusers"
SPEC = LaunchSpec(MODEL, gpus=(0,))
LEANER = LaunchSpec(MODEL, gpus=(0,), memory=MemoryConfig(offload="module"))
OOM_LOAD = ServerFailure(failures.OOM_LOAD, "The server ran out of GPU memory while loading", fix="set offload")


class Run:
    """A spawned server process as a start reads it: ready, or the planned failure from wait_ready."""

    def __init__(self, launch: Launch, outcome: Optional[ServerFailure]) -> None:
        self.launch, self.outcome = launch, outcome
        self.port = launch.port
        self.url = f"http://127.0.0.1:{launch.port}"
        self.states: list[tuple[str, bool]] = []

    def write_state(self, requested_fingerprint: str, ready: bool) -> None:
        self.states.append((requested_fingerprint, ready))

    def wait_ready(self, budget: float, cancel: Callable[[], bool], tick: Callable[[], None],
                   phase_text: Callable[[], str], context: Callable[[Optional[int]], Any]) -> None:
        if self.outcome is not None:
            raise self.outcome


class Role(ServerRole):
    """The plain server role with its process faked: one planned outcome per spawn (None: ready)."""

    def __init__(self, *outcomes: Optional[ServerFailure]) -> None:
        self.outcomes = list(outcomes)
        self.spawned: list[Run] = []

    def spawn(self, launch: Launch, generation: int, data_dir: str, on_segment: Callable[[str, bool], None],
              cancel: Callable[[], bool]) -> Run:   # type: ignore[override]
        run = Run(launch, self.outcomes.pop(0))
        self.spawned.append(run)
        return run


class Owner:
    """The supervisor's side of a start (starting.Generations), recording what the start asks.
    `leaner`: what the fallback steps down to (None: no fallback)."""

    def __init__(self, spec: LaunchSpec, leaner: Optional[LaunchSpec]) -> None:
        self.spec = self.requested_spec = spec
        self.fallback = (lambda spec, kind: None) if leaner is not None else None
        self.leaner = leaner
        self.run: Optional[Run] = None
        self.generation = 0
        self.stepped: list[str] = []
        self.ready: list[tuple[LaunchSpec, Run, str]] = []

    def begin_generation(self) -> int:
        self.generation += 1
        return self.generation

    def spawned(self, run: Run) -> None:
        self.run = run

    def step_down(self, spec: LaunchSpec, kind: str) -> Optional[tuple[LaunchSpec, str]]:
        self.stepped.append(kind)
        if self.leaner is None:
            return None
        self.spec = self.leaner
        return self.leaner, "offload none -> module"

    def failure_context(self, spec: LaunchSpec, exit_code: Optional[int], ever_ready: bool) -> failures.Context:
        return failures.Context(model=spec.model, exit_code=exit_code, ever_ready=ever_ready)

    def now_ready(self, spec: LaunchSpec, run: Run, text: str) -> None:
        self.ready.append((spec, run, text))


class Start:
    """A Starter for `spec` on a local configuration in `tmp` (its own GPU lock folder), with the
    board's changes recorded."""

    def __init__(self, tmp: Path, role: Role, spec: LaunchSpec = SPEC, leaner: Optional[LaunchSpec] = None,
                 port: Optional[int] = None) -> None:
        self.board = StatusBoard(threading.RLock(), lambda: (self.board.phase, self.board.text))  # type: ignore
        self.seen: list[tuple[str, str]] = []
        self.board.listen(self.seen.append)              # type: ignore[arg-type]
        self.role, self.owner, self.clock = role, Owner(spec, leaner), LaunchClock()
        config = LocalConfig(server_command=(sys.executable,), data_dir=str(tmp / "data"),
                             gpu_lock_dir=str(tmp / "gpu-locks"), port=port)
        progress = ProgressTracker()
        log = LogEvents(self.board, progress, self.clock, run=lambda: None, ready=lambda: False,
                        used=lambda: None, job_oom=lambda line: None)
        self.gpus = gpu_lock.GpuClaim(config.gpu_lock_dir)
        self.starter = Starter(self.owner, self.board, progress, log, self.clock, self.gpus, config=config,
                               role=role, key_mode=True, data_dir=config.data_dir)

    def __call__(self, cancel: Callable[[], bool] = lambda: False) -> None:
        try:
            self.starter.start(None, None, cancel)
        finally:
            self.gpus.release()


def test_a_start_says_where_it_starts_and_is_ready_with_the_roles_text(tmp_path: Path) -> None:
    start = Start(tmp_path, Role(None))
    start()
    (run,) = start.role.spawned
    assert (STARTING, f"Starting {MODEL} on GPU 0 (port {run.port})") in start.seen
    assert start.owner.ready == [(SPEC, run, f"Ready: {MODEL} at {run.url} (GPU 0)")]
    assert run.states == [(SPEC.fingerprint(), False)]       # recorded as not ready until it is
    env = run.launch.command.env
    assert env["CUDA_VISIBLE_DEVICES"] == "0" and len(env["VLLM_API_KEY"]) >= 32     # a fresh key, not in argv
    assert env["VLLM_API_KEY"] not in " ".join(run.launch.command.argv)
    assert start.clock.last_s is not None, "the start is measured: the cancel policy weighs a restart with it"


def test_a_start_that_lost_the_race_for_its_free_port_tries_once_more_on_another(tmp_path: Path) -> None:
    start = Start(tmp_path, Role(failures.port_taken(40001), None))
    start()
    assert len(start.role.spawned) == 2 and len(start.owner.ready) == 1

    start = Start(tmp_path, Role(failures.port_taken(40001), failures.port_taken(40002)))
    with pytest.raises(ServerFailure) as info:
        start()
    assert info.value.kind == failures.PORT_IN_USE and len(start.role.spawned) == 2
    assert (start.board.phase, start.board.text) == (FAILED, "Port 40002 is already in use")


def test_a_configured_port_taken_is_not_swapped_for_another(tmp_path: Path) -> None:
    port = probe.free_port("127.0.0.1")
    start = Start(tmp_path, Role(failures.port_taken(port), None), port=port)
    with pytest.raises(ServerFailure) as info:
        start()
    assert info.value.kind == failures.PORT_IN_USE and len(start.role.spawned) == 1


def test_a_start_out_of_memory_tries_the_leaner_spec_on_the_same_port(tmp_path: Path) -> None:
    start = Start(tmp_path, Role(OOM_LOAD, None), leaner=LEANER)
    start()
    first, second = start.role.spawned
    assert start.owner.stepped == [failures.OOM_LOAD]
    assert (first.launch.spec, second.launch.spec) == (SPEC, LEANER)
    assert second.port == first.port, "nodes hold the URL: the retry keeps it"
    assert start.owner.ready == [(LEANER, second, f"Ready: {MODEL} at {second.url} (GPU 0)")]


def test_a_fallback_that_offers_a_spec_already_tried_ends_the_start_saying_nothing_is_left(tmp_path: Path) -> None:
    start = Start(tmp_path, Role(OOM_LOAD, OOM_LOAD), leaner=LEANER)
    with pytest.raises(ServerFailure) as info:
        start()
    assert len(start.role.spawned) == 2, "never the same spec twice"
    assert info.value.kind == failures.OOM_LOAD
    assert info.value.fix == "set offload; automatic fallback has no leaner configuration left"
    assert (start.board.phase, start.board.text) == (FAILED, OOM_LOAD.what) and start.board.last_error is info.value


def test_without_a_fallback_an_out_of_memory_start_fails_with_its_own_fix(tmp_path: Path) -> None:
    start = Start(tmp_path, Role(OOM_LOAD))
    with pytest.raises(ServerFailure) as info:
        start()
    assert info.value is OOM_LOAD and start.owner.stepped == [] and len(start.role.spawned) == 1


def test_any_other_failure_ends_the_start_as_its_status(tmp_path: Path) -> None:
    config_error = ServerFailure(failures.CONFIG, "The model's config is not valid", fix="pick another model")
    start = Start(tmp_path, Role(config_error, None), leaner=LEANER)
    with pytest.raises(ServerFailure) as info:
        start()
    assert info.value is config_error and len(start.role.spawned) == 1 and start.owner.stepped == []
    assert (start.board.phase, start.board.text) == (FAILED, config_error.what)


def test_a_cancel_ends_the_start_as_cancelled_not_as_its_failure(tmp_path: Path) -> None:
    start = Start(tmp_path, Role(ServerFailure(failures.CRASH, "The server exited while starting")))
    with pytest.raises(LaunchCancelled):
        start(cancel=lambda: bool(start.role.spawned))      # cancelled while the process started
    assert start.board.phase != FAILED

    start = Start(tmp_path, Role(None))
    with pytest.raises(LaunchCancelled):
        start(cancel=lambda: True)                          # cancelled before anything was spawned
    assert start.role.spawned == []
