"""VideoClient against the stub server: the real vLLM-Omni 0.30 HTTP layer, fake engine.

The stub's frames are frame_code.encode(i, seed, w, h), so a decoded clip proves the frame
count, size, order and seed end to end. Knobs: VLLM_OMNI_STUB_STEP_S (seconds per denoise
step), VLLM_OMNI_STUB_CRASH_AFTER_JOBS=N, VLLM_API_KEY turns on auth (environment), and
extra_params {"stub_oom": true} (one job runs out of GPU memory).

The servers are the session's shared stubs (shared_stubs.py: each start costs a vLLM
import) except the one this module crashes on purpose.
"""
from __future__ import annotations

import json
import time
from typing import Any, Iterator

import numpy as np
import pytest

import frame_code
import stubserver
from shared_stubs import I2V_SPLIT, KEY, T2V, T2V_KEYED, TI2V, TI2V_OFFLOAD
from stub_pool import StubPool

from vllm_omni_launcher.client.api import VideoClient, VideoRequest
from vllm_omni_launcher.client.job_results import GenerationCancelled, JobUpdate
from vllm_omni_launcher.client.images import image_to_png
from vllm_omni_launcher.errors import LauncherError

HEALTH_TIMEOUT = 900.0   # several stubs start at once; a shared 2-core CI box is slow
W, H = 256, 128          # multiples of 32: valid for every family, frame_code blocks survive yuv420p


CRASH_ENV = {"VLLM_OMNI_STUB_CRASH_AFTER_JOBS": "1", "VLLM_OMNI_STUB_STEP_S": "0.05"}


@pytest.fixture(scope="module")
def stubs(stub_pool: StubPool) -> Iterator[dict[str, Any]]:
    """The shared stubs, and this module's own one that crashes; all start together."""
    names = (TI2V_OFFLOAD, I2V_SPLIT, T2V_KEYED)
    with stubserver.run_stub(T2V, env=CRASH_ENV) as crash, stub_pool.lease(*names) as shared:
        crash.wait_healthy(HEALTH_TIMEOUT)
        yield {**dict(zip(names, shared)), "crash": crash}


@pytest.fixture
def ti2v(stubs: dict[str, Any]) -> Any:
    return stubs[TI2V_OFFLOAD]


@pytest.fixture
def i2v(stubs: dict[str, Any]) -> Any:
    return stubs[I2V_SPLIT]


@pytest.fixture
def t2v_keyed(stubs: dict[str, Any]) -> Any:
    return stubs[T2V_KEYED]


def request(seed: int, frames: int = 9, **kw: Any) -> VideoRequest:
    kw.setdefault("steps", 4)
    return VideoRequest("a red fox in snow", width=W, height=H, num_frames=frames, fps=16, seed=seed, **kw)


def assert_stub_frames(video: Any, frames: int, seed: int, width: int = W, height: int = H) -> None:
    assert video.frames.dtype == np.float32
    assert video.frames.shape == (frames, height, width, 3)
    assert [frame_code.decode(f) for f in video.frames] == [(i % 256, seed % 256) for i in range(frames)]


def job_gone(client: VideoClient, job_id: str) -> bool:
    with pytest.raises(LauncherError) as info:
        client.status(job_id)
    return "no longer knows" in info.value.what and "404" in info.value.raw


# ----------------------------------------------------------------------------- generation


def test_t2v_frames_match_what_the_stub_encoded(t2v_keyed):
    client = VideoClient(t2v_keyed.url, api_key=KEY)
    updates: list[JobUpdate] = []
    result = client.generate(request(seed=1234, frames=13), on_update=updates.append)
    assert_stub_frames(result.video, 13, 1234)
    assert result.video.fps == pytest.approx(16.0)
    assert updates and updates[-1].status == "completed"
    assert job_gone(client, result.job_id)  # generate deleted it


def test_ti2v_text_only_frames_and_fps(ti2v):
    client = VideoClient(ti2v.url)
    result = client.generate(VideoRequest("a boat", width=W, height=H, num_frames=17, fps=24, seed=77, steps=3))
    assert_stub_frames(result.video, 17, 77)
    assert result.video.fps == pytest.approx(24.0)
    t = result.timings
    assert 0 <= t["submit"] <= t["job_done"] <= t["downloaded"] <= t["decoded"]


def test_ti2v_with_image(ti2v):
    client = VideoClient(ti2v.url)
    png = image_to_png(np.full((H, W, 3), 0.5, np.float32))
    result = client.generate(request(seed=5, image_png=png))
    assert_stub_frames(result.video, 9, 5)


def test_fractional_fps_reaches_the_mp4(ti2v):
    client = VideoClient(ti2v.url)
    result = client.generate(VideoRequest("x", width=W, height=H, num_frames=5, fps=12.5, seed=9, steps=2))
    assert_stub_frames(result.video, 5, 9)
    assert result.video.fps == pytest.approx(12.5, rel=1e-3)


def test_i2v_with_image(i2v):
    client = VideoClient(i2v.url)
    png = image_to_png(np.zeros((H, W, 3), np.uint8))
    result = client.generate(request(seed=300, image_png=png))
    assert_stub_frames(result.video, 9, 300)


def test_i2v_without_image_fails_the_job_with_the_image_setting(i2v):
    client = VideoClient(i2v.url)
    with pytest.raises(LauncherError) as info:
        client.generate(request(seed=1))
    assert info.value.setting == "image" and "No image is provided" in info.value.raw


def test_i2v_size_not_multiple_of_16_fails_the_job_naming_width(i2v):
    client = VideoClient(i2v.url)
    png = image_to_png(np.zeros((H, W, 3), np.uint8))
    with pytest.raises(LauncherError) as info:
        client.generate(VideoRequest("x", width=250, height=128, num_frames=5, fps=16, seed=1, steps=2,
                                     image_png=png))
    assert info.value.setting == "width" and "divisible by 16" in info.value.raw


# ----------------------------------------------------------------------------- 4xx


def test_steps_over_200_is_refused_naming_steps(ti2v):
    with pytest.raises(LauncherError) as info:
        VideoClient(ti2v.url).submit(request(seed=1, steps=500))
    err = info.value
    assert err.setting == "steps" and "1..200" in err.fix and "HTTP 400" in err.raw


def test_guidance_over_20_is_refused_naming_guidance(ti2v):
    with pytest.raises(LauncherError) as info:
        VideoClient(ti2v.url).submit(request(seed=1, guidance=25.0))
    assert info.value.setting == "guidance" and "HTTP 400" in info.value.raw


def test_bad_seconds_is_refused_naming_the_field(ti2v):
    with pytest.raises(LauncherError) as info:
        VideoClient(ti2v.url).submit(request(seed=1, extra={"seconds": "4.5"}))
    err = info.value
    assert "seconds" in err.why and err.setting == "seconds" and "body.seconds" in err.raw
    assert "whole number" in err.fix


def test_unknown_job_is_404(ti2v):
    client = VideoClient(ti2v.url)
    assert job_gone(client, "video_gen_does_not_exist")


def test_no_key_against_a_keyed_server_is_explained(t2v_keyed):
    client = VideoClient(t2v_keyed.url)
    assert client.health() is True  # /health is open
    with pytest.raises(LauncherError) as info:
        client.submit(request(seed=1))
    err = info.value
    assert "requires an API key" in err.what and "VLLM_OMNI_LAUNCHER_REMOTE_API_KEY" in err.fix
    assert "Unauthorized" in err.raw


def test_wrong_key_is_explained_and_never_shown(t2v_keyed):
    wrong = "wrong-key-0000"
    client = VideoClient(t2v_keyed.url, api_key=wrong)
    with pytest.raises(LauncherError) as info:
        client.models()
    err = info.value
    assert "rejected the API key" in err.what and wrong not in str(err) and wrong not in repr(client)


def test_models_lists_the_served_name(t2v_keyed, ti2v):
    assert VideoClient(t2v_keyed.url, api_key=KEY).models() == [T2V]
    assert VideoClient(ti2v.url).models() == [TI2V]


# ----------------------------------------------------------------------------- cancel


def _wait_status(client: VideoClient, job_id: str, status: str, timeout: float = 60.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if client.status(job_id).status == status:
            return
        time.sleep(0.05)
    raise AssertionError(f"job {job_id} never reached {status}")


def test_cancel_while_running_deletes_the_job(t2v_keyed):
    client = VideoClient(t2v_keyed.url, api_key=KEY)
    seen: list[str] = []

    def on_update(update: JobUpdate) -> None:
        seen.append(update.status)

    with pytest.raises(GenerationCancelled) as info:
        client.generate(request(seed=2, steps=200), on_update=on_update,
                        should_cancel=lambda: "in_progress" in seen)
    err = info.value
    assert err.status == "in_progress" and err.deleted and "cannot abort" in err.why
    assert job_gone(client, err.job_id)


def test_cancel_while_queued_deletes_the_job(t2v_keyed):
    client = VideoClient(t2v_keyed.url, api_key=KEY)
    blocker = client.submit(request(seed=3, steps=200))
    try:
        _wait_status(client, blocker, "in_progress")
        seen: list[str] = []
        with pytest.raises(GenerationCancelled) as info:
            client.generate(request(seed=4), on_update=lambda u: seen.append(u.status),
                            should_cancel=lambda: len(seen) >= 2)
        err = info.value
        assert seen == ["queued", "queued"] and err.status == "queued" and "never reached the GPU" in err.why
        assert job_gone(client, err.job_id)
    finally:
        assert client.delete(blocker)
    assert job_gone(client, blocker)


# ----------------------------------------------------------------------------- failures


def test_oom_in_job_explains_the_fix(ti2v):
    client = VideoClient(ti2v.url)
    with pytest.raises(LauncherError) as info:
        client.generate(request(seed=1, extra={"extra_params": json.dumps({"stub_oom": True})}))
    err = info.value
    assert "ran out of memory" in err.what
    for word in ("width/height", "frames", "vae_tiling", "offload", "parallel_mode", "--parallel ulysses=2", "auto"):
        assert word in err.fix
    assert "out of memory" in err.raw.lower() and '"status": "failed"' in err.raw
    # the server is still usable afterwards
    assert_stub_frames(client.generate(request(seed=2)).video, 9, 2)


def test_server_dying_mid_job_gives_a_clear_error_without_hanging(stubs):
    """CRASH_AFTER_JOBS=1: job A completes, then the engine dies while job B is running."""
    handle = stubs["crash"]
    client = VideoClient(handle.url)
    first = client.submit(request(seed=1, steps=2))
    seen: list[str] = []
    with pytest.raises(LauncherError) as info:
        client.generate(request(seed=2, steps=200), on_update=lambda u: seen.append(u.status))
    err = info.value
    assert "stopped answering while job" in err.what and err.setting == "server"
    # A plain client is a remote one: the fix points at the log on the server's own machine.
    assert "log on the machine that runs the server" in err.fix
    assert "refuses connections" in err.why and "exited" in err.why
    assert "in_progress" in seen or "queued" in seen
    assert first not in err.what


def test_job_over_the_time_limit_is_deleted(t2v_keyed):
    client = VideoClient(t2v_keyed.url, api_key=KEY)
    ids: list[str] = []
    with pytest.raises(LauncherError) as info:
        client.generate(request(seed=6, steps=200), timeout_s=1.0, on_update=lambda u: ids.append(u.job_id))
    assert info.value.setting == "timeout" and "did not finish within 1 s" in info.value.what
    assert job_gone(client, ids[0])
