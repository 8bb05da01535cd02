"""A workflow never picks how much memory the launcher allocates (client/clip_memory.py): a clip whose
decoded frames could pass the local config's `max_clip_memory_gib` (default: a quarter of the machine's
RAM) is refused before the job is sent, with the setting named; Generate Batch counts its clips before
it builds their list. Server: our own hostile one on 127.0.0.1 (hostile_server.py), answering with a
tiny black MP4 of whatever size was asked."""
from __future__ import annotations

import tracemalloc
from typing import Callable

import pytest

import hostile_media as hm
import hostile_server as hs
from clips import solid_clip
from comfy_standin import run_node
from hostile_jobs import job_routes
from vllm_omni_launcher.client import clip_memory
from vllm_omni_launcher.client.api import VideoClient, VideoRequest
from vllm_omni_launcher.client.batch import run_batch
from vllm_omni_launcher.errors import LauncherError
from vllm_omni_launcher.nodes import NODES, progress, session
from vllm_omni_launcher.nodes.batch_session import clip_plan
from vllm_omni_launcher.nodes.handles import ServerHandle
from vllm_omni_launcher.server.config import local_config

GIB = 1 << 30
HOSTILE = VideoRequest("x", width=1024, height=1024, num_frames=1025)     # 12 GiB as float32
WIDGET_MAX = VideoRequest("x", width=4096, height=4096, num_frames=1025)  # 192 GiB


@pytest.fixture
def serving(hostile) -> Callable[[bytes], hs.HostileServer]:
    """A hostile server whose one job completes at once with `mp4` as its content."""
    return lambda mp4: hostile(job_routes(hs.answer(200, mp4)))


@pytest.fixture(scope="module")
def black_1024() -> bytes:
    data = hm.long_black(1024, 1024, 1025)
    assert len(data) < 64 << 10         # a tiny file that would decode to 12 GiB
    return data


@pytest.fixture
def ram_16_gib(monkeypatch) -> None:
    monkeypatch.setattr(clip_memory, "machine_ram_bytes", lambda: 16 * GIB)


def test_a_clip_past_the_default_cap_is_refused_before_it_is_sent(serving, black_1024, ram_16_gib):
    server = serving(black_1024)
    tracemalloc.start()
    try:
        with pytest.raises(LauncherError) as info:
            VideoClient(server.url).generate(HOSTILE)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    err = info.value
    assert not isinstance(err, MemoryError)
    assert err.what == ("A 1024x1024x1025 clip needs 12.0 GiB of memory; this machine allows 4.0 GiB per clip")
    assert "max_clip_memory_gib = 4.0 GiB (the default, a quarter of this machine's 16 GiB of RAM)" in err.why
    assert "Nothing was sent to the server" in err.why
    assert "raise max_clip_memory_gib in vllm_omni_launcher.json (or VLLM_OMNI_LAUNCHER_MAX_CLIP_MEMORY_GIB)" \
        in err.fix and err.setting == "frames"
    assert server.log == [] and peak < 4 << 20          # no job, no allocation


def test_the_widgets_own_maximum_is_refused_naming_what_it_would_need(serving, ram_16_gib):
    server = serving(b"")
    with pytest.raises(LauncherError, match=r"4096x4096x1025 clip needs 192\.2 GiB"):
        VideoClient(server.url).generate(WIDGET_MAX)
    assert server.log == []


def test_a_configured_cap_is_the_limit_and_named_as_set(serving, black_1024):
    server = serving(black_1024)
    with pytest.raises(LauncherError) as info:
        VideoClient(server.url, clip_memory_gib=2.0).generate(HOSTILE)
    assert "this machine allows 2.0 GiB per clip" in info.value.what
    assert "max_clip_memory_gib = 2.0 GiB (set in the launcher's local config)" in info.value.why
    assert server.log == []


def test_frame_interpolation_counts_against_the_cap():
    # 1280x720x81 is 0.8 GiB; interpolated x2 (up to 162 frames) it is 1.7 GiB.
    request = VideoRequest("x", width=1280, height=720, num_frames=81)
    assert VideoClient("http://127.0.0.1:9", clip_memory_gib=1.0).clip_bounds(request).max_frames == 81
    with pytest.raises(LauncherError, match="needs 1.7 GiB"):
        VideoClient("http://127.0.0.1:9", clip_memory_gib=1.0).clip_bounds(request, frame_multiplier=2)


def test_a_clip_within_the_cap_is_made_as_before(serving):
    server = serving(solid_clip(64, 64, 9))
    result = VideoClient(server.url, clip_memory_gib=0.001).generate(VideoRequest("x", width=64, height=64,
                                                                                  num_frames=9))
    assert result.video.frames.shape == (9, 64, 64, 3)     # 0.4 MiB of frames under a 1 MiB cap


def test_only_the_mp4_asked_for_allocates_no_frames_so_the_cap_does_not_apply(serving, ram_16_gib):
    # `generate --out` without --frames-npy keeps the MP4 only; the request still meets its own checks.
    server = serving(solid_clip(1024, 1024, 9))
    result = VideoClient(server.url).generate(VideoRequest("x", width=1024, height=1024, num_frames=9),
                                              decode=False)
    assert result.video is None and result.info.num_frames == 9


def test_a_batch_checks_every_clip_before_the_first_is_sent(serving, black_1024, ram_16_gib):
    server = serving(black_1024)
    small = VideoRequest("x", width=64, height=64, num_frames=9)
    with pytest.raises(LauncherError, match="1024x1024x1025 clip needs 12.0 GiB"):
        run_batch(VideoClient(server.url), [small, HOSTILE])
    assert server.log == []


def test_the_cap_is_one_local_setting_with_its_variable(monkeypatch, tmp_path):
    monkeypatch.setenv("VLLM_OMNI_LAUNCHER_CONFIG", str(tmp_path / "none.json"))
    monkeypatch.delenv(clip_memory.ENV_VAR, raising=False)
    assert local_config.load_local_config().max_clip_memory_gib is None        # the default: from RAM
    monkeypatch.setenv(clip_memory.ENV_VAR, "2.5")
    assert local_config.load_local_config().max_clip_memory_gib == 2.5
    row = next(line for line in local_config.config_reference().splitlines() if clip_memory.SETTING in line)
    assert row.startswith(f"| `{clip_memory.ENV_VAR}` | `max_clip_memory_gib` | number | a quarter of this "
                          "machine's RAM |")
    assert "and all of one Generate Batch's clips together" in row        # check_batch_memory's cap too
    monkeypatch.setenv(clip_memory.ENV_VAR, "0")
    with pytest.raises(LauncherError, match="must be greater than 0"):
        local_config.load_local_config()


def test_the_nodes_client_carries_the_machines_cap(monkeypatch, tmp_path):
    monkeypatch.setenv("VLLM_OMNI_LAUNCHER_CONFIG", str(tmp_path / "none.json"))
    monkeypatch.setenv(clip_memory.ENV_VAR, "3")
    handle = ServerHandle("remote", "http://127.0.0.1:9", "wan", "ti2v_5b")
    client, sup = session.job_client(handle, progress.NodeReporter(None))
    with client:
        assert sup is None and client.clip_memory_gib == 3.0


def test_the_default_is_a_quarter_of_the_machines_ram():
    assert clip_memory.default_cap_gib() == pytest.approx(clip_memory.machine_ram_bytes() / 4 / GIB)
    assert clip_memory.cap_bytes(None) == int(clip_memory.default_cap_gib() * GIB)


# ----------------------------------------------------------------------------- Generate Batch's clip count

def test_a_batch_counts_its_clips_before_building_the_list():
    prompts = "a fox\n" * 200_000
    tracemalloc.start()
    try:
        with pytest.raises(LauncherError) as info:
            clip_plan(prompts, 0, 64, 8)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert info.value.what == ("The batch asks for 12800000 clips (200000 prompt(s) x batch_count 64); this "
                               "machine allows 8")
    # the lines themselves are a list (about 12 MB traced); 12.8 million (prompt, seed) pairs would be over 1 GB
    assert peak < 40 << 20, f"peak {peak / 1e6:.0f} MB"


@pytest.mark.parametrize("field, value", [("batch_count", "3"), ("batch_count", float("nan")),
                                          ("seed", "12"), ("batch_count", True)])
def test_batch_widgets_of_the_wrong_type_get_the_launchers_message(field, value):
    args = {**{i.name: i.default for i in NODES["VLLMOmniGenerateBatch"].inputs() if not i.optional},
            "server": ServerHandle("remote", "http://127.0.0.1:9", "wan", "ti2v_5b"), "prompts": "a fox", field: value}
    with pytest.raises(LauncherError) as info:           # the node's own check (nodes/schema.py), before clip_plan
        run_node("VLLMOmniGenerateBatch", **args)
    assert f"input '{field}' got" in info.value.what and "a whole number" in info.value.why
    assert info.value.setting == field


def test_a_batch_within_the_limit_is_planned_as_before():
    assert clip_plan("a\nb", 5, 2, 8) == [("a", 5), ("a", 6), ("b", 5), ("b", 6)]
    assert clip_plan("a", 2 ** 63 - 1, 2, 8) == [("a", 2 ** 63 - 1), ("a", 0)]
