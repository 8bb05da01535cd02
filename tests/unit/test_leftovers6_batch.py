"""Issue 17 leftovers (session 6) of Generate Batch:

* a batch that (re)starts a stopped local server plans it for the batch's job count, so the plan and
  the replica suggestion are the ones Local Server shows when it starts the server for that batch;
* where the requests fix the clip's shape (bounds.expected_shape), the batch's rows exist before the
  first download and every clip, the first included, decodes straight into its rows; a clip decoded
  elsewhere is still copied in, and clips of another shape are still refused.

The client side uses test_batch_core's FakeClient (a scripted job queue with real H.264 clips); the
node side test_batch_plan's queued prompt and ComfyUI stand-in, with a server program that does not
exist (a fault: the launch fails after planning, and nothing starts)."""
from __future__ import annotations

import json
from typing import Callable, Optional

import numpy as np
import pytest

from test_batch_core import F, H, W, FakeClient, request, seeds_of
from test_batch_plan import JOB, TI2V, _batch, _prompt
from comfy_standin import ComfyStandIn
from vllm_omni_launcher import NODE_CLASS_MAPPINGS
from vllm_omni_launcher.client.batch import run_batch
from vllm_omni_launcher.client.bounds import ClipBounds, expected_shape
from vllm_omni_launcher.client.request import FrameInterpolation, VideoRequest
from vllm_omni_launcher.client.streamed_download import StreamedVideo
from vllm_omni_launcher.errors import LauncherError
from vllm_omni_launcher.nodes.handles import ServerHandle, ServingChoice
from vllm_omni_launcher.planner.launch_plan import GPU_MEMORY_ENV


# ---- a restart from Generate Batch plans for the batch ---------------------------------------------------
@pytest.fixture
def no_server(monkeypatch, tmp_path):
    config = tmp_path / "vllm_omni_launcher.json"
    config.write_text(json.dumps({"server_command": [str(tmp_path / "no-such-serve")],
                                  "data_dir": str(tmp_path / "data")}))
    monkeypatch.setenv("VLLM_OMNI_LAUNCHER_CONFIG", str(config))
    monkeypatch.setenv(GPU_MEMORY_ENV, "80,80")


def _plan_texts(comfy: ComfyStandIn, node: str) -> list[str]:
    return [text for text, at in comfy.texts if at == node and "jobs are queued" in text]


def test_a_batch_that_starts_a_stopped_server_plans_it_for_its_clips_as_local_server_does(no_server):
    model = NODE_CLASS_MAPPINGS["VLLMOmniLoadModel"]().load(TI2V)[0]
    serving = ServingChoice()
    with ComfyStandIn() as comfy:
        with pytest.raises(LauncherError):               # Local Server, for a queued batch of 3 lines x 2
            NODE_CLASS_MAPPINGS["VLLMOmniLocalServer"]().start(model, serving, unique_id="3",
                                                               prompt=_prompt(**{"10": _batch("a\nb\nc", 2)}))
        # the server is not running (stopped, idle or crashed): Generate Batch starts it again
        handle = ServerHandle("local", "", TI2V, model.family_key, server_id="stopped", model=model,
                              serving=serving)
        with pytest.raises(LauncherError):
            NODE_CLASS_MAPPINGS["VLLMOmniGenerateBatch"]().generate(handle, prompts="a\nb\nc", batch_count=2,
                                                                    unique_id="10", **JOB)
    at_start, at_restart = _plan_texts(comfy, "3"), _plan_texts(comfy, "10")
    assert at_restart and at_restart == at_start, comfy.texts
    assert "6 jobs are queued and the model fits one GPU: replicas 2" in at_restart[0]


def test_a_single_job_that_starts_a_stopped_server_gets_no_batch_advice(no_server):
    model = NODE_CLASS_MAPPINGS["VLLMOmniLoadModel"]().load(TI2V)[0]
    handle = ServerHandle("local", "", TI2V, model.family_key, server_id="stopped", model=model,
                          serving=ServingChoice())
    with ComfyStandIn() as comfy, pytest.raises(LauncherError):
        NODE_CLASS_MAPPINGS["VLLMOmniGenerateVideo"]().generate(handle, prompt="a cat", unique_id="11", **JOB)
    assert any(at == "11" and "starting it again" in text for text, at in comfy.texts), comfy.texts
    assert _plan_texts(comfy, "11") == []


# ---- every clip decodes into its rows ---------------------------------------------------------------------
class Targets(FakeClient):
    """FakeClient that records, per download, the rows it was given and the array it decoded into.
    `ignore_into`: decode elsewhere (what decode_mp4 does when the stream's header does not say the rows' shape)."""

    def __init__(self, *args, ignore_into: bool = False, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.ignore_into = ignore_into
        self.targets: list[tuple[str, Optional[np.ndarray], np.ndarray]] = []

    def download_decoded(self, job_id: str, bounds: ClipBounds, *, into: Optional[np.ndarray] = None,
                         should_cancel: Optional[Callable[[], bool]] = None) -> StreamedVideo:
        got = super().download_decoded(job_id, bounds, into=None if self.ignore_into else into,
                                       should_cancel=should_cancel)
        self.targets.append((job_id, into, got.video.frames))
        return got


def test_the_first_clip_of_a_batch_decodes_straight_into_the_batchs_rows():
    # job 1 completes first: the first clip decoded is not clip 0
    client = Targets([["in_progress", "completed"], ["completed"], ["queued", "in_progress", "completed"]])
    result = run_batch(client, [request(10), request(11), request(12)])
    assert [job for job, _, _ in client.targets] == ["job-1", "job-0", "job-2"]
    for job, into, decoded in client.targets:
        i = int(job.split("-")[1])
        assert into is not None and into.base is result.frames          # the batch's own buffer, from the start
        assert decoded is into                                            # decoded there: nothing to copy
        assert np.shares_memory(decoded, result.frames[result.clip_rows(i)])
    assert seeds_of(result.frames) == [(f, s) for s in (10, 11, 12) for f in range(F)]


def test_a_clip_decoded_elsewhere_is_copied_into_its_rows():
    client = Targets([["completed"], ["completed"]], ignore_into=True)
    result = run_batch(client, [request(1), request(2)])
    assert all(into is not None and not np.shares_memory(decoded, result.frames)
               for _, into, decoded in client.targets)
    assert seeds_of(result.frames) == [(f, s) for s in (1, 2) for f in range(F)]


def test_requests_that_leave_the_shape_to_the_server_fix_it_with_the_first_clip():
    reqs = [VideoRequest("a fox", num_frames=F, fps=16, steps=3, seed=s) for s in (1, 2)]   # no size sent
    client = Targets([["completed"], ["in_progress", "completed"]])
    result = run_batch(client, reqs)
    (_, first_into, first), (_, second_into, second) = client.targets
    assert first_into is None and not np.shares_memory(first, result.frames)        # decoded on its own, copied
    assert second_into is not None and second is second_into and np.shares_memory(second, result.frames)
    assert result.frames.shape == (2 * F, H, W, 3)
    assert seeds_of(result.frames) == [(f, s) for s in (1, 2) for f in range(F)]


def test_a_clip_of_another_shape_than_its_rows_is_refused_before_it_is_decoded():
    # every request fixes 5 frames 64x32, so the rows exist before the first download; the server's
    # clip 0 has 9 frames: its bounds refuse it (as for any request) and no job is left
    client = Targets([["completed"], ["in_progress"]], shape={0: (F + 4, W, H)})
    with pytest.raises(LauncherError) as info:
        run_batch(client, [request(1), request(2)])
    assert "does not match the request" in info.value.what and f"{W}x{H}x{F + 4}" in info.value.what
    assert sorted(client.deleted) == ["job-0", "job-1"]


def test_the_expected_shape_is_the_bounds_one_clip_only():
    assert expected_shape(request(1).bounds()) == (F, H, W)
    assert expected_shape(VideoRequest("x", width=W, height=H, num_frames=F + 1).bounds()) is None     # rounded
    assert expected_shape(VideoRequest("x", num_frames=F).bounds()) is None                            # no size
    interpolated = VideoRequest("x", width=W, height=H, num_frames=F, interpolation=FrameInterpolation("/m"))
    assert expected_shape(interpolated.bounds()) is None            # (F-1)*2+1 .. 2F frames: not one count
    frames, height, width = expected_shape(request(1).bounds())
    rows = np.empty((frames, height, width, 3), dtype=np.float32)
    client = FakeClient([["completed"]])
    client.seeds["job-0"] = 1
    got = client.download_decoded("job-0", request(1).bounds(), into=rows)
    assert got.video.frames is rows                                 # decode_mp4 takes rows of exactly this shape
