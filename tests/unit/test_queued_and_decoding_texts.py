"""The Generate node's status line while its job waits and after its denoise: it says the server is busy
only when that is known (a supervised server's log shows an earlier job still denoising) or likely (queued
well past an idle server's pickup), and the decode line says what its clock counts."""
from __future__ import annotations

from types import SimpleNamespace
from typing import Optional

from comfy_standin import ComfyStandIn
from vllm_omni_launcher.nodes import progress


def _poll(status: str, queued_s: float = 0.0, running_s: float = 0.0) -> SimpleNamespace:
    return SimpleNamespace(status=status, queued_s=queued_s, running_s=running_s, job_id="j")


def _run(run_id: int, step: int, total: int = 40, done: bool = False, aborted: bool = False) -> SimpleNamespace:
    """What Supervisor.progress() gives: the newest denoise run the server's log shows."""
    return SimpleNamespace(run_id=run_id, step=step, total=total, done=done, aborted=aborted, eta_s=None)


def _texts(polls: list[SimpleNamespace], local: Optional[SimpleNamespace] = None, *, run_floor: int = -1,
           supervised: bool = False) -> list[str]:
    with ComfyStandIn() as comfy:
        tracker = progress.JobProgress(progress.NodeReporter("5"), steps=40, run_floor=run_floor,
                                       local_progress=(lambda: local) if supervised else None)
        for poll in polls:
            tracker.on_update(poll)
    return [text for text, _ in comfy.texts]


def test_the_first_job_on_an_idle_server_is_not_called_busy():
    texts = _texts([_poll("queued", 0.0), _poll("queued", 0.4)], None, supervised=True)
    assert texts == ["Queued 0s (waiting for the server to start it)"]
    assert not any("busy" in t for t in _texts([_poll("queued", 1.0)]))                    # remote too


def test_an_earlier_job_still_denoising_on_a_supervised_server_is_named_at_once():
    texts = _texts([_poll("queued", 0.2)], _run(run_id=3, step=12), run_floor=3, supervised=True)
    assert texts == ["Queued 0s (the server is busy with another job, at step 12/40)"]


def test_a_finished_or_failed_earlier_run_is_not_a_busy_server():
    for earlier in (_run(3, 40, done=True), _run(3, 7, aborted=True)):
        assert _texts([_poll("queued", 1.0)], earlier, run_floor=3, supervised=True) == [
            "Queued 1s (waiting for the server to start it)"]


def test_a_long_wait_without_a_log_to_read_says_busy_as_a_likelihood():
    texts = _texts([_poll("queued", 1.0), _poll("queued", progress.QUEUED_QUIET_S + 7)])
    assert texts[-1] == "Queued 12s (the server has not started it yet: it may be busy with another job)"


def test_the_decode_line_counts_the_time_since_the_job_started():
    texts = _texts([_poll("in_progress", running_s=11.2)], _run(run_id=4, step=40, done=True), run_floor=3,
                   supervised=True)
    assert texts == ["Decoding the video (11s since the job started)"]
