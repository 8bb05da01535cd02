"""The first job of its size on a remote server has no estimate, yet its node shows a bar that
moves with the time elapsed (never full until the job is done) and says what the bar means."""
from __future__ import annotations

from types import SimpleNamespace

from comfy_standin import ComfyStandIn
from vllm_omni_launcher.nodes import progress


def test_the_first_remote_job_gets_an_elapsed_time_bar():
    with ComfyStandIn() as comfy:
        tracker = progress.JobProgress(progress.NodeReporter("7"), steps=40)
        for t in (1, 5, 30, 60, 300, 3600):
            tracker.on_update(SimpleNamespace(status="in_progress", queued_s=0.0, running_s=float(t), job_id="j"))
        moving = [value for value, _ in comfy.progress]
        tracker.finish()
    assert moving == sorted(moving) and len(set(moving)) == len(moving)       # it moves with every poll
    assert moving[3] == progress.REMOTE_BAR // 2 and moving[-1] < progress.REMOTE_BAR   # half-way at 60 s, never full
    assert comfy.progress[-1] == (progress.REMOTE_BAR, progress.REMOTE_BAR)   # full once the job is done
    assert comfy.texts[-1] == ("Running 60:00 (first job of this size on this server: no estimate yet, so the bar "
                               "shows time elapsed)", "7")
