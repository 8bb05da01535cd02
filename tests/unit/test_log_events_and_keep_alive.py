"""Two of the supervisor's parts on their own, with no server: what a log segment changes
(server/supervision/log_events.py) and when a server is idle (keep_alive.py)."""
from __future__ import annotations

import threading

from manual_clock import Clock
from vllm_omni_launcher.server.logs.logwatch import LOADING, STARTING, ProgressTracker
from vllm_omni_launcher.server.supervision.cancel_policy import LaunchClock
from vllm_omni_launcher.server.supervision.keep_alive import KeepAlive
from vllm_omni_launcher.server.supervision.log_events import VERSION_NOTE, LogEvents
from vllm_omni_launcher.server.supervision.status import StatusBoard

OOM = "(Worker pid=12) ERROR torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."


def _board() -> StatusBoard:
    board = StatusBoard(threading.RLock(), lambda: None)  # type: ignore[arg-type,return-value] - no listener
    board.set(STARTING, "Starting")
    return board


def test_startup_lines_drive_the_phase_only_before_ready_and_an_oom_after_ready_is_handed_on() -> None:
    board, ready, ooms = _board(), [False], []
    log = LogEvents(board, ProgressTracker(), LaunchClock(), run=lambda: None, ready=lambda: ready[0],
                    used=lambda: None, job_oom=ooms.append)
    log.on_segment("(APIServer pid=9) INFO vLLM server version 0.30.0", True)
    log.on_segment(OOM, True)
    log.on_segment("(Worker pid=12) INFO Loading weights took 12.50 seconds", True)
    assert log.server_version == (0, 30)
    assert (board.phase, board.text) == (LOADING, "Weights read in 12.50 s")
    assert ooms == [], "an out-of-memory line while starting is the start's failure, not a job's"

    ready[0] = True
    log.on_segment("(Worker pid=12) INFO Loading weights took 3.00 seconds", True)
    assert board.text == "Weights read in 12.50 s", "after ready the log no longer moves the phase"
    log.on_segment(OOM, True)
    assert ooms == [OOM]


def test_a_version_mismatch_line_is_one_warning() -> None:
    board = _board()
    log = LogEvents(board, ProgressTracker(), LaunchClock(), run=lambda: None, ready=lambda: False,
                    used=lambda: None, job_oom=lambda line: None)
    for _ in range(2):
        log.on_segment("WARNING vllm and vllm-omni have mismatched major/minor versions", True)
    assert board.warnings == [VERSION_NOTE]


def test_a_denoise_bar_is_use_and_a_running_denoise_is_never_idle() -> None:
    clock = Clock()
    progress = ProgressTracker(clock=clock)
    progress.mark_server_up()
    keep = KeepAlive(1.0, clock=clock)
    log = LogEvents(_board(), progress, LaunchClock(), run=lambda: None, ready=lambda: True, used=keep.touch,
                    job_oom=lambda line: None)
    clock.now += 59
    assert not keep.expired(progress)
    clock.now += 2
    assert keep.expired(progress), "a minute with no use"

    keep.touch()
    log.on_segment(" 50%|#####     | 1/2 [00:01<00:01,  1.00it/s]", False)
    clock.now += 3600
    assert not keep.expired(progress), "a denoise is running: its polls may be far apart"
    log.on_segment("100%|##########| 2/2 [00:02<00:00,  1.00it/s]", True)    # the bar ends: use, now
    clock.now += 59
    assert not keep.expired(progress)
    clock.now += 2
    assert keep.expired(progress)
    keep.minutes = 0
    assert not keep.expired(progress), "keep_alive_minutes 0: never idle"
