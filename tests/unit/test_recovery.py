"""Recovery (server/supervision/recovery.py) on its own: what it does once a server was ready and
something goes wrong. A crash or a hang restarts the server on the same port within the restart
budget, a spent budget or a failure a restart would only repeat ends it with the reason, a job out
of memory restarts onto the fallback's leaner spec, a hard cancel's restart counts in the budget,
an idle server is stopped. The supervisor's side is a recording owner (`Lifecycle`) whose server
process is faked: a launch is ready or raises the failure planned for it; the clock is a fake."""
from __future__ import annotations

import threading
from typing import Optional

import pytest

from manual_clock import Clock
from vllm_omni_launcher.server.launch.spec import LaunchSpec, MemoryConfig
from vllm_omni_launcher.server.logs import failures
from vllm_omni_launcher.server.logs.failures import ServerFailure
from vllm_omni_launcher.server.logs.logwatch import ProgressTracker
from vllm_omni_launcher.server.supervision.keep_alive import KeepAlive
from vllm_omni_launcher.server.supervision.recovery import Recovery
from vllm_omni_launcher.server.supervision.restart_policy import RestartPolicy
from vllm_omni_launcher.server.supervision.status import FAILED, READY, RESTARTING, STOPPED, StatusBoard

MODEL = "Wan-AI/Wan2.2-TI2V-5B-Diffusers"
PORT = 8123
CRASH_TAIL = ["(APIServer pid=9) INFO Generating video", "RuntimeError: an unknown worker error"]
CRASHED = "The vLLM-Omni server exited after it was ready (exit code 1)"
OOM = "(Worker pid=12) ERROR torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."
LEANER = "offload none -> module"


class Run:
    """The ready generation's process, as far as recovery reads it."""

    port, server_pid = PORT, None

    def drain(self) -> None:
        pass


class Owner:
    """The supervisor's operations (recovery.Lifecycle), recording what recovery asks of them.
    `launches`: per relaunch, None (ready) or the ServerFailure that start raises; `leaner`: what the
    fallback steps down to (None: nothing leaner)."""

    def __init__(self, board: StatusBoard, launches: tuple[Optional[ServerFailure], ...] = (),
                 fallback: bool = False, leaner: Optional[LaunchSpec] = None) -> None:
        self.board = board
        self.spec = LaunchSpec(MODEL)
        self.fallback = (lambda spec, kind: None) if fallback else None
        self.leaner = leaner
        self.run: Optional[Run] = Run()
        self.generation = 1
        self.ready = True
        self.launches = list(launches)
        self.launched: list[Optional[int]] = []       # the preferred port of each relaunch
        self.ended: list[tuple[Optional[str], Optional[str], bool]] = []
        self.stopped = 0
        self.stepped: list[str] = []

    def ready_run(self) -> Optional[Run]:
        return self.run if self.ready else None

    def mark_not_ready(self) -> None:
        self.ready = False

    def tail(self, lines: int = 40) -> list[str]:
        return list(CRASH_TAIL)

    def ready_at(self) -> str:
        return f"Ready at http://127.0.0.1:{PORT}"

    def failure_context(self, spec: LaunchSpec, exit_code: Optional[int], ever_ready: bool) -> failures.Context:
        return failures.Context(model=spec.model, exit_code=exit_code, ever_ready=ever_ready)

    def step_down(self, spec: LaunchSpec, kind: str) -> Optional[tuple[LaunchSpec, str]]:
        self.stepped.append(kind)
        if self.leaner is None:
            return None
        self.spec = self.leaner
        self.board.add_note(LEANER)
        return self.leaner, LEANER

    def launch(self, preferred_port: Optional[int]) -> None:
        self.launched.append(preferred_port)
        failure = self.launches.pop(0) if self.launches else None
        if failure is not None:
            raise failure
        self.generation += 1
        self.run, self.ready = Run(), True

    def stop_process(self, graceful: bool, timeout: float) -> None:
        self.stopped += 1
        self.ready = False

    def end(self, phase: Optional[str], text: Optional[str], timeout: float, graceful: bool = False) -> None:
        self.ended.append((phase, text, graceful))
        self.stop_process(graceful, timeout)
        if phase is not None:
            self.board.set(phase, text)


class Parts:
    """A Recovery with its board, progress, budget, idle clock and stop event."""

    def __init__(self, max_restarts: int = 5, keep_alive_minutes: float = 0.0, **owner: object) -> None:
        lock = threading.RLock()
        self.clock = Clock()
        self.board = StatusBoard(lock, lambda: None)  # type: ignore[arg-type,return-value] - no listener
        self.board.set(READY, f"Ready at http://127.0.0.1:{PORT}")
        self.progress = ProgressTracker(clock=self.clock)
        self.progress.mark_server_up()
        self.stopping = threading.Event()
        self.restarts = RestartPolicy(max_restarts=max_restarts, backoff_s=(0.0,), clock=self.clock)
        self.owner = Owner(self.board, **owner)  # type: ignore[arg-type]
        self.recovery = Recovery(self.owner, self.board, self.progress, lock=lock, op_lock=threading.RLock(),
                                 stopping=self.stopping, restarts=self.restarts,
                                 keep_alive=KeepAlive(keep_alive_minutes, clock=self.clock), hang_timeout_s=60.0)


def test_a_crash_after_ready_restarts_on_the_same_port_and_says_why() -> None:
    parts = Parts()
    parts.recovery.on_exit(1)
    assert parts.owner.launched == [PORT] and parts.owner.ended == []
    assert parts.board.phase == READY
    assert parts.board.text == f"Restarted after: {CRASHED}. Ready at http://127.0.0.1:{PORT} (generation 2)"
    assert parts.board.restart_reason == f"{CRASHED} (crash)"
    assert parts.board.last_error.what == CRASHED and parts.board.last_error.raw.endswith(CRASH_TAIL[-1])
    assert (parts.recovery.restart_count, parts.restarts.recent) == (1, 1)


def test_a_server_that_keeps_dying_is_given_up_with_the_budget_and_then_a_new_window_restarts_it() -> None:
    parts = Parts(max_restarts=2)
    for _ in range(3):
        parts.recovery.on_exit(1)
    assert len(parts.owner.launched) == 2
    assert parts.owner.ended == [(FAILED, f"Gave up after 2 restarts in 30 minutes: {CRASHED}", False)]
    assert parts.board.phase == FAILED

    parts.clock.now += 31 * 60               # the restarts of the last half hour no longer count
    parts.recovery.on_exit(1)
    assert len(parts.owner.launched) == 3 and parts.board.phase == READY


def test_a_hang_restarts_within_the_same_budget_naming_the_seconds() -> None:
    parts = Parts()
    parts.recovery.on_hang(61.0)
    assert parts.board.last_error.kind == failures.HUNG and "for 61 s" in parts.board.last_error.what
    assert parts.owner.launched == [PORT]
    assert parts.board.text.startswith("Restarted after: stopped answering. ") and parts.restarts.recent == 1


@pytest.mark.parametrize("kind", sorted(failures.PERMANENT - {failures.OOM_LOAD}))
def test_a_restart_that_fails_for_good_ends_the_server_with_that_failure(kind: str) -> None:
    parts = Parts(launches=(ServerFailure(kind, "The restart cannot work"),))
    parts.recovery.on_exit(1)
    assert parts.owner.launched == [PORT]                 # one try, no loop on a failure a retry repeats
    assert parts.owner.ended == [(FAILED, "The restart cannot work", False)]


@pytest.mark.parametrize("kind", [failures.CRASH, failures.OOM_LOAD, failures.TIMEOUT])
def test_a_restart_that_fails_for_a_passing_reason_is_tried_again_within_the_budget(kind: str) -> None:
    parts = Parts(launches=(ServerFailure(kind, "The first restart failed"), None))
    parts.recovery.on_exit(1)
    assert parts.owner.launched == [PORT, PORT] and parts.owner.ended == []
    assert parts.board.phase == READY and parts.board.text.startswith("Restarted after: The first restart failed")
    assert parts.restarts.recent == 2


def test_a_job_out_of_memory_with_a_fallback_queues_one_restart_onto_the_leaner_spec() -> None:
    leaner = LaunchSpec(MODEL, memory=MemoryConfig(offload="module"))
    parts = Parts(fallback=True, leaner=leaner)
    parts.progress.feed(" 50%|#####     | 1/2 [00:01<00:01,  1.00it/s]")
    parts.recovery.on_job_oom(OOM)
    assert parts.recovery.monitor.take_request() == ("oom_job", "a job ran out of GPU memory")
    parts.recovery.on_job_oom(OOM)           # one traceback prints several OOM lines: one job OOM
    assert parts.recovery.monitor.take_request() is None
    assert parts.board.last_error.kind == failures.OOM_JOB and parts.progress.current().aborted
    assert parts.owner.launched == [], "the restart runs on the monitor's thread, not the log's"

    parts.recovery.handle_request_locked("oom_job", "a job ran out of GPU memory")
    assert parts.owner.spec == leaner and parts.owner.launched == [PORT]
    assert parts.board.restart_reason == f"a job ran out of GPU memory; fallback: {LEANER}"
    assert parts.board.text.startswith(f"Restarted with: {LEANER}. ")


def test_a_job_out_of_memory_without_a_fallback_keeps_the_server_and_says_the_fix() -> None:
    parts = Parts()
    parts.recovery.on_job_oom(OOM)
    err = parts.board.last_error
    assert parts.recovery.monitor.take_request() is None and parts.owner.launched == []
    assert parts.board.phase == READY
    assert parts.board.text == f"Ready at http://127.0.0.1:{PORT}; the last job ran out of GPU memory ({err.fix})"


def test_an_oom_restart_with_no_leaner_configuration_left_keeps_the_server() -> None:
    parts = Parts(fallback=True)
    parts.recovery.handle_request_locked("oom_job", "a job ran out of GPU memory")
    assert parts.owner.stepped == [failures.OOM_JOB] and parts.owner.launched == []
    assert parts.board.phase == READY and parts.board.text.endswith(
        "the last job ran out of GPU memory and the fallback has no leaner configuration left")


def test_a_crash_from_a_job_out_of_memory_steps_down_before_the_restart() -> None:
    parts = Parts(fallback=True, leaner=LaunchSpec(MODEL, memory=MemoryConfig(offload="module")))
    parts.owner.tail = lambda lines=40: [OOM]                       # type: ignore[method-assign]
    parts.recovery.on_exit(1)
    assert parts.board.last_error.kind == failures.OOM_JOB
    assert parts.owner.stepped == [failures.OOM_JOB] and parts.owner.spec.memory.offload == "module"
    assert parts.owner.launched == [PORT]


def test_a_hard_cancel_restart_is_queued_and_counted_in_the_restart_budget() -> None:
    parts = Parts(max_restarts=1)
    parts.restarts.next_delay()                              # the budget is spent by a crash already
    note = "Cancelled job j1 was still running on the GPU; restarting the server to free the GPU"
    parts.progress.feed(" 50%|#####     | 1/2 [00:01<00:01,  1.00it/s]")
    parts.recovery.restart_for_cancel(note)
    assert not parts.owner.ready and parts.progress.current().aborted
    assert (parts.board.phase, parts.board.text, parts.board.restart_reason) == (RESTARTING, note, note)
    assert parts.recovery.monitor.take_request() == ("hard_cancel", note)

    parts.recovery.handle_request_locked("hard_cancel", note)
    assert parts.owner.launched == [PORT], "a restart the launcher asks for is never refused"
    assert parts.restarts.recent == 2, "but it counts: a workflow cancelling in a loop cannot restart forever"
    assert parts.board.text.startswith("Cancelled job j1 was still running on the GPU. Ready at")


def test_an_idle_server_is_stopped_only_once_its_keep_alive_ran_out() -> None:
    parts = Parts(keep_alive_minutes=10)
    parts.clock.now += 9 * 60
    parts.recovery.on_idle()
    assert parts.owner.ended == [] and not parts.recovery.idle_expired()
    parts.clock.now += 61
    assert parts.recovery.idle_expired()
    parts.recovery.on_idle()
    assert parts.owner.ended == [(STOPPED, "Stopped after 10 idle minute(s) to free the GPUs; the next job starts it "
                                           "again", True)]


def test_nothing_is_restarted_or_stopped_once_the_supervisor_is_stopping() -> None:
    parts = Parts(keep_alive_minutes=1)
    parts.stopping.set()
    parts.clock.now += 3600
    parts.recovery.on_exit(1)
    parts.recovery.on_request("hard_cancel", "a note")
    parts.recovery.on_idle()
    assert parts.owner.launched == [] and parts.owner.ended == [] and parts.restarts.recent == 0
    assert parts.recovery.monitor_finished()


class Role:
    """A server role whose own watch of the ready run reports `lost` (a head that wedged, say)."""

    watches_replica_processes = False

    def __init__(self, lost: Optional[ServerFailure]) -> None:
        self.lost = lost

    def watch(self, run: Run, progress: ProgressTracker):
        return lambda: self.lost


def test_what_the_roles_watch_finds_restarts_the_whole_group_once() -> None:
    parts = Parts()
    wedged = ServerFailure(failures.HUNG, "The head made no progress for 25 s")
    assert parts.recovery.watch_ready(Role(wedged), parts.owner.spec, parts.owner.run) is None   # nothing missing
    assert parts.recovery.dead_replica() is wedged
    parts.recovery.on_replica_exit(wedged)
    assert parts.owner.launched == [PORT] and parts.board.last_error is wedged
    assert parts.recovery.dead_replica() is None, "reported once; the next ready run is watched anew"
