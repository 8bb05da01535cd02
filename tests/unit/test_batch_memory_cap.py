"""A batch's clips are one IMAGE array, so the machine's `max_clip_memory_gib` bounds their sum, not only
each clip (client/clip_memory.py check_batch_memory): a batch past it is refused before any job is sent
or any frame allocated, in the client (run_batch) and in Generate Batch before a server is started or
contacted, naming the setting and the widgets to lower; a batch within it runs as before. Server: our
own on 127.0.0.1 (hostile_server.py)."""
from __future__ import annotations

import itertools
import json
import tracemalloc
from typing import Any

import pytest

import hostile_server as hs
from clips import solid_clip
from comfy_standin import run_node
from hostile_jobs import job_body
from vllm_omni_launcher.client.api import VideoClient
from vllm_omni_launcher.client.batch import run_batch
from vllm_omni_launcher.client.request import VideoRequest
from vllm_omni_launcher.errors import LauncherError
from vllm_omni_launcher.models import FAMILIES
from vllm_omni_launcher.nodes import batch_session
from vllm_omni_launcher.nodes.handles import ServerHandle

SMALL = VideoRequest("a fox", width=64, height=64, num_frames=9, steps=2)      # 0.42 MiB of frames
SMALL_CAP_GIB = 0.001                                                            # 1.0 MiB: two fit, three do not


def jobs_server(hostile: Any, count: int) -> hs.HostileServer:
    """`count` jobs that complete at once, each serving a 64x64x9 clip."""
    ids, mp4 = itertools.count(), solid_clip(64, 64, 9)
    routes: dict = {("POST", "/v1/videos"): lambda peer: hs.answer(200, job_body(f"j{next(ids)}", "queued"))(peer)}
    for i in range(count):
        routes[("GET", f"/v1/videos/j{i}")] = hs.answer(200, job_body(f"j{i}"))
        routes[("GET", f"/v1/videos/j{i}/content")] = hs.answer(200, mp4)
        routes[("DELETE", f"/v1/videos/j{i}")] = hs.answer(200, {"id": f"j{i}", "deleted": True})
    return hostile(routes)


def test_clips_that_each_fit_but_not_together_are_refused_before_a_job_is_sent_or_a_frame_allocated(hostile):
    server = jobs_server(hostile, 8)
    requests = [VideoRequest(f"clip {i}", width=512, height=512, num_frames=93, seed=i) for i in range(8)]
    client = VideoClient(server.url, clip_memory_gib=1.0)
    assert all(client.clip_bounds(r) for r in requests)                  # each 0.27 GiB: every clip passes alone
    tracemalloc.start()
    try:
        with pytest.raises(LauncherError) as info:
            run_batch(client, requests)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    err = info.value
    assert err.what == "8 clips of 512x512x93 need 2.2 GiB of memory together; this machine allows 1.0 GiB"
    assert "the batch's frames are one IMAGE array holding every clip" in err.why
    assert "max_clip_memory_gib = 1.0 GiB (set in the launcher's local config)" in err.why
    assert "Nothing was sent to the server" in err.why
    assert err.fix.startswith("lower batch_count or use fewer prompt lines, or lower width, height or frames")
    assert "raise max_clip_memory_gib in vllm_omni_launcher.json (or VLLM_OMNI_LAUNCHER_MAX_CLIP_MEMORY_GIB)" \
        in err.fix and err.setting == "batch_count"
    assert server.log == [] and peak < 4 << 20        # no job, and not the 2.2 GiB array


def test_a_batch_within_the_cap_runs_and_one_clip_more_is_refused(hostile):
    server = jobs_server(hostile, 3)
    result = run_batch(VideoClient(server.url, clip_memory_gib=SMALL_CAP_GIB), [SMALL, SMALL])
    assert result.frames.shape == (18, 64, 64, 3) and len(result.clips) == 2
    sent = len(server.log)
    with pytest.raises(LauncherError, match=r"^3 clips of 64x64x9 need 0\.0 GiB of memory together"):
        run_batch(VideoClient(server.url, clip_memory_gib=SMALL_CAP_GIB), [SMALL, SMALL, SMALL])
    assert len(server.log) == sent                    # the third batch sent nothing


def test_one_clip_past_the_cap_keeps_the_per_clip_wording(hostile):
    server = jobs_server(hostile, 1)
    big = VideoRequest("x", width=1024, height=1024, num_frames=1025)
    with pytest.raises(LauncherError) as info:
        run_batch(VideoClient(server.url, clip_memory_gib=2.0), [SMALL, big])
    assert info.value.what.startswith("A 1024x1024x1025 clip needs 12.0 GiB") and info.value.setting == "frames"
    assert server.log == []


def test_generate_batch_refuses_the_sum_before_a_server_is_started_or_contacted(tmp_path, monkeypatch):
    config = tmp_path / "launcher.json"
    config.write_text(json.dumps({"max_clip_memory_gib": 1.0}))
    monkeypatch.setenv("VLLM_OMNI_LAUNCHER_CONFIG", str(config))
    contacted: list[Any] = []
    monkeypatch.setattr(batch_session.session, "job_client", lambda *a: contacted.append(a))
    family = FAMILIES["ti2v_5b"]
    handle = ServerHandle("remote", "http://127.0.0.1:9", family.hf_id, family.key)
    with pytest.raises(LauncherError) as info:
        run_node("VLLMOmniGenerateBatch", handle, prompts="a fox\na cat", negative_prompt="", width=512, height=512,
                 frames=93, fps=0.0, steps=0, guidance=-1.0, guidance_2=-1.0, boundary_ratio=-1.0, flow_shift=-1.0,
                 seed=1, batch_count=4)
    assert info.value.what.startswith("8 clips of 512x512x93 need 2.2 GiB") and info.value.setting == "batch_count"
    assert not contacted
