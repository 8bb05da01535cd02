"""Batches against the stub (real vLLM-Omni 0.30 HTTP layer and job store, fake engine): the core
(client/batch.py) with the real VideoClient, its cancel, and the Generate Batch node through a
Remote Server handle with the ComfyUI stand-in.

The stub's frames carry their index and the job's seed (frame_code), so the concatenated IMAGE
proves order, count and seed of every clip. The stub runs a batch one job after another (it has
no request batching), which is what a 0.26 server or `--max-num-seqs 1` does too.
"""
from __future__ import annotations

import re

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

import frame_code
from comfy_standin import ComfyStandIn, InterruptProcessingException, run_node
from shared_stubs import KEY, T2V_KEYED, TI2V_OFFLOAD
from stubserver import wait_for

from vllm_omni_launcher.client.api import VideoClient, VideoRequest
from vllm_omni_launcher.client.batch import BatchCancelled, run_batch
from vllm_omni_launcher.errors import LauncherError

W, H, F = 256, 128, 9


def request(seed: int, prompt: str = "a red fox in snow", steps: int = 3) -> VideoRequest:
    return VideoRequest(prompt, width=W, height=H, num_frames=F, fps=16, steps=steps, seed=seed)


def gone(client: VideoClient, job_id: str) -> bool:
    try:
        client.status(job_id)
    except LauncherError as err:
        return "404" in err.raw
    return False


def test_a_batch_returns_every_clip_in_order_and_leaves_no_job_on_the_server(stub_pool):
    with stub_pool.lease(TI2V_OFFLOAD) as (stub,), VideoClient(stub.url) as client:
        seeds = [21, 22, 300]
        result = run_batch(client, [request(s, prompt=f"prompt {i}") for i, s in enumerate(seeds)])
        assert result.frames.shape == (3 * F, H, W, 3)
        assert [frame_code.decode(f) for f in result.frames] == [(i, s % 256) for s in seeds for i in range(F)]
        assert [(c.num_frames, c.width, c.height, c.fps) for c in result.clips] == [(F, W, H, 16.0)] * 3
        assert all(c.mp4[4:8] == b"ftyp" for c in result.clips)
        assert all(gone(client, c.job_id) for c in result.clips)


def test_cancel_deletes_every_submitted_and_queued_job(stub_pool):
    # the keyed stub runs one job at a time at 0.05 s per step: one runs, two wait
    with stub_pool.lease(T2V_KEYED) as (stub,), VideoClient(stub.url, api_key=KEY) as client:
        seen: list[tuple[str, ...]] = []
        with pytest.raises(BatchCancelled) as info:
            run_batch(client, [request(s, steps=200) for s in (1, 2, 3)],
                      on_update=lambda u: seen.append(u.statuses),
                      should_cancel=lambda: bool(seen) and "in_progress" in seen[-1])
        err = info.value
        assert sorted(status for _, status in err.jobs) == ["in_progress", "queued", "queued"]
        assert err.deleted and err.clips_done == 0 and "cannot abort" in err.why
        assert all(gone(client, job) for job, _ in err.jobs)


def test_generate_batch_node_returns_all_clips_with_one_bar_and_cancel_deletes_them(stub_pool):
    with stub_pool.lease(TI2V_OFFLOAD) as (stub,), ComfyStandIn() as comfy:
        handle = run_node("VLLMOmniRemoteServer", stub.url, "ti2v_5b", unique_id="remote")[0]
        values: dict[str, Any] = dict(server=handle, prompts="a fox\n\na cat\n", negative_prompt="", width=64,
                                      height=64, frames=5, fps=12.0, steps=2, guidance=-1.0, guidance_2=-1.0,
                                      boundary_ratio=-1.0, flow_shift=-1.0, seed=40, batch_count=2,
                                      unique_id="batch")
        image, fps, videos, summary = run_node("VLLMOmniGenerateBatch", **values)
        assert tuple(image.shape) == (4 * 5, 64, 64, 3) and str(image.dtype) == "torch.float32" and fps == 12.0
        assert [frame_code.decode(f) for f in image.numpy()] == [(i, s) for s in (40, 41, 40, 41) for i in range(5)]
        assert isinstance(videos, list) and len(videos) == 4
        assert summary.startswith("Done: 4 clips of 5 frames 64x64 at 12 fps")
        assert "clip 3: seed 40, a cat" in summary
        # How many were in progress together is what the server's job states showed: upstream's bundled TI2V config
        # admits up to 4 requests per wave (max_num_seqs 4), and a clip's MP4 encode overlaps the next one's
        # denoise, so depending on arrival either sentence is the true one; neither claims batching.
        assert ("the server ran them one after another" in summary
                or re.search(r"up to [234] jobs were in progress on the server at once \(", summary)), summary
        bars = list(comfy.progress)
        assert bars[-1] == (8, 8) and all(total == 8 for _, total in bars)         # one bar: 4 clips x 2 steps

        # Cancel (ComfyUI's interrupt) once the first clip runs: the node ends as interrupted, no job is left
        comfy.texts.clear()
        values.update(steps=200, seed=50, frames=9)
        with ThreadPoolExecutor(1) as pool:                # ComfyUI runs nodes on a worker thread too
            running = pool.submit(run_node, "VLLMOmniGenerateBatch", **values)
            wait_for(lambda: any(t.startswith("Clip 1/4:") for t, _ in comfy.texts), 60, "the first clip to run")
            comfy.interrupt.set()
            interrupted = running.exception(timeout=30)
        assert isinstance(interrupted, InterruptProcessingException), interrupted
        cancelled = interrupted.__context__
        assert isinstance(cancelled, BatchCancelled) and len(cancelled.jobs) == 4
        final = [text for text, node_id in comfy.texts if node_id == "batch"][-1]
        # how many were still queued depends on how many the server took in its first wave (1 to 4, above)
        statuses = [status for _, status in cancelled.jobs]
        assert set(statuses) <= {"queued", "in_progress"} and "in_progress" in statuses, statuses
        queued = statuses.count("queued")
        assert final.startswith(f"Cancelled after 0 clip(s): deleted 4 job(s); {queued} never reached the GPU"), final
        with VideoClient(stub.url) as client:
            assert all(gone(client, job) for job, _ in cancelled.jobs)

