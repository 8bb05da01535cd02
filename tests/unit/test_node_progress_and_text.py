"""The reporter that turns launch and job events into ComfyUI's node text and progress bar
(ComfyUI stand-in): text and bar sent only on change, a pending Cancel never cleared, a failure
named, a launch phase's progress shown, and a remote job's elapsed time past its estimate.
"""
from __future__ import annotations

import pytest

from comfy_standin import ComfyStandIn
from vllm_omni_launcher.errors import LauncherError
from vllm_omni_launcher.nodes import progress


def test_reporter_sends_text_and_bar_only_when_they_change():
    with ComfyStandIn() as comfy:
        reporter = progress.NodeReporter("5")
        for _ in range(3):
            reporter.text("Step 1/3")
            reporter.bar(1, 3)
        reporter.text("Step 2/3")
        reporter.bar(2, 3)
        reporter.text("")                    # the front end ignores empty text: something is always shown
    assert comfy.texts == [("Step 1/3", "5"), ("Step 2/3", "5"), ("…", "5")]
    assert comfy.progress == [(1, 3), (2, 3)]


def test_reporter_sees_a_pending_cancel_and_never_clears_it_while_the_bar_moves():
    with ComfyStandIn() as comfy:
        reporter = progress.NodeReporter("5")
        assert not reporter.cancel_requested()
        comfy.interrupt.set()
        reporter.bar(1, 10)                  # the V3 progress API never consumes ComfyUI's Cancel
        assert comfy.interrupt.is_set() and reporter.cancel_requested() and comfy.progress == [(1, 10)]
        reporter.close()
        reporter.bar(2, 10)                  # the node has returned: no more bar
    assert comfy.progress == [(1, 10)]


def test_a_run_replaces_the_last_text_and_a_failure_says_what_went_wrong():
    with ComfyStandIn() as comfy:
        with pytest.raises(LauncherError):
            with progress.reporting("9", "Checking the request") as reporter:
                reporter.text("Done: earlier run")
                raise LauncherError("frames 10 is not valid for Wan2.2", "4k+1", "set frames to 9")
        reporter.bar(1, 2)                   # after the node returned: no bar from late callbacks
    assert [t for t, _ in comfy.texts] == ["Checking the request", "Done: earlier run",
                                           "Failed: frames 10 is not valid for Wan2.2"]
    assert comfy.progress == []


def test_launch_status_shows_the_phase_progress_on_the_bar_and_in_the_text():
    class St:
        text, progress, fallback_note = "Downloading the model", (1200.0, 23000.0, "MB"), None

    with ComfyStandIn() as comfy:
        reporter = progress.NodeReporter("3")
        reporter.launch_status(St())
    assert comfy.texts == [("Downloading the model (1,200/23,000 MB)", "3")]
    assert comfy.progress == [(1200, 23000)]


class _Update:
    def __init__(self, running_s: float) -> None:
        self.status, self.queued_s, self.running_s, self.job_id = "in_progress", 0.0, running_s, "j"


def test_remote_progress_shows_elapsed_time_and_grows_past_the_estimate():
    with ComfyStandIn() as first_comfy:
        first = progress.JobProgress(progress.NodeReporter("1"), steps=40)
        first.on_update(_Update(12.4))
    assert first_comfy.texts[0] == ("Running 12s (first job of this size on this server: no estimate yet, so the "
                                    "bar shows time elapsed)", "1")
    assert 0 < first_comfy.progress[-1][0] < progress.REMOTE_BAR      # a bar on the first job too
    with ComfyStandIn() as comfy:
        tracker = progress.JobProgress(progress.NodeReporter("2"), steps=40, remote_estimate_s=20.0)
        for t in range(0, 61, 2):
            tracker.on_update(_Update(float(t)))
    texts = [t for t, node in comfy.texts if node == "2"]
    assert "Running 10s, ~10s left (estimated from earlier jobs on this server)" in texts
    assert not any("~0s left" in t for t in texts)
    assert texts[-1] == "Running 1:00: longer than the ~20s earlier jobs took here, so no time left can be estimated"
    bar = [value for value, _ in comfy.progress]
    assert bar == sorted(bar) and bar[-1] < progress.REMOTE_BAR and bar[-1] > bar[len(bar) // 2]
