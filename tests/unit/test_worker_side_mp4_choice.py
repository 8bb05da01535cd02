"""Which request carries vLLM-Omni 0.30's worker-side MP4 (`extra_params.preencode_mp4`): the decision table of
server/launch/worker_mp4.py `settle` (family, server version, the launch's VAE and batching settings, the
request's interpolation, fps and raw fields) and how VideoRequest.form_fields sends, merges or refuses it.
What the real 0.30 parser and Wan pipelines make of the forms: tests/contract/test_pipeline_forms.py."""
from __future__ import annotations

import json

import numpy as np
import pytest

from vllm_omni_launcher.client import media
from vllm_omni_launcher.client.request import FrameInterpolation, VideoRequest
from vllm_omni_launcher.errors import LauncherError
from vllm_omni_launcher.models import ALL_FAMILIES, FAMILIES, request_for
from vllm_omni_launcher.server.launch.flags import batch_width
from vllm_omni_launcher.server.launch.sections import MemoryConfig, ParallelConfig
from vllm_omni_launcher.server.launch.spec import LaunchSpec
from vllm_omni_launcher.server.launch.worker_mp4 import server_blocker, settle

V30, V26 = (0, 30), (0, 26)
TI2V = FAMILIES["ti2v_5b"]


def _default_request(family):
    """The request the nodes and the CLI build for `family` with every widget at the model's value."""
    if family.pipeline == "vace":
        return request_for(family, prompt="a cat")
    if family.pipeline == "s2v":
        speech = media.audio_clip(np.zeros((1, 16000 * 2), np.float32), 16000)
        return request_for(family, prompt="a singer", image=np.zeros((448, 832, 3), np.uint8), audio=speech)
    image = np.zeros((family.height, family.width, 3), np.uint8) if family.image_input == "required" else None
    return request_for(family, prompt="a fox", image=image)


def _settled(request, spec=None, version=V30, model=TI2V.hf_id):
    settle(request, spec if spec is not None else LaunchSpec(model=model), version)
    return request.preencode


def _sent(request, version=V30):
    raw = request.form_fields(version).get("extra_params")
    return None if raw is None else json.loads(raw)


@pytest.mark.parametrize("key", sorted(ALL_FAMILIES))
def test_each_family_default_request_carries_it_exactly_where_its_pipeline_reads_it(key):
    family = ALL_FAMILIES[key]
    request = _default_request(family)
    assert request.preencode is None                        # request_for alone decides nothing
    carries = family.pipeline != "vace"                     # VACE's pipeline never reads the switch
    assert _settled(request, model=family.hf_id) is carries
    assert (_sent(request) or {}).get("preencode_mp4") is (True if carries else None)


def test_a_server_before_0_30_or_one_the_launcher_did_not_start_never_gets_it():
    assert _settled(_default_request(TI2V), version=V26) is False
    remote = _default_request(TI2V)
    settle(remote, None, None)                               # a remote server / --url: its version is unknown
    assert remote.preencode is False and "extra_params" not in remote.form_fields(V30)


@pytest.mark.parametrize("memory, parallel, flags", [
    (MemoryConfig(vae_tiling=True), ParallelConfig(), ()),
    (MemoryConfig(), ParallelConfig(mode="ulysses", degree=2, vae_patch=2), ()),
    (MemoryConfig(vae_slicing=True), ParallelConfig(), ()),
    (MemoryConfig(), ParallelConfig(), ("--max-num-seqs=2",)),
    (MemoryConfig(), ParallelConfig(), ("--max-num-seqs", "4", "--request-batch-max-wait-ms=50")),
])
def test_a_tiled_vae_or_a_batching_server_does_not_get_it(memory, parallel, flags):
    spec = LaunchSpec(model=TI2V.hf_id, memory=memory, parallel=parallel, extra_flags=flags)
    assert server_blocker(spec) is not None
    assert _settled(_default_request(TI2V), spec) is False


@pytest.mark.parametrize("memory, parallel, flags", [
    (MemoryConfig(offload="module"), ParallelConfig(), ()),
    (MemoryConfig(offload="layerwise"), ParallelConfig(), ()),
    (MemoryConfig(), ParallelConfig(mode="ulysses", degree=2), ()),
    (MemoryConfig(), ParallelConfig(mode="cfg", degree=2), ()),
    (MemoryConfig(), ParallelConfig(), ("--max-num-seqs=1",)),
])
def test_offload_sequence_or_cfg_parallel_and_a_batch_of_one_keep_it(memory, parallel, flags):
    spec = LaunchSpec(model=TI2V.hf_id, memory=memory, parallel=parallel, extra_flags=flags)
    assert server_blocker(spec) is None and _settled(_default_request(TI2V), spec) is True


def test_batch_width_reads_both_spellings_of_max_num_seqs():
    assert batch_width(()) == 1
    assert batch_width(("--max-num-seqs=3",)) == 3
    assert batch_width(("--dtype", "bfloat16", "--max-num-seqs", "2")) == 2


@pytest.mark.parametrize("change", [
    {"interpolation": FrameInterpolation("/srv/rife", exp=1)},
    {"extra": {"enable_frame_interpolation": "true"}},
    {"extra": {"output_type": "pil"}},
    {"fps": 23.976},
])
def test_frame_interpolation_another_output_type_or_a_fractional_fps_does_not_get_it(change):
    request = VideoRequest("a fox", **{"width": 1280, "height": 704, "num_frames": 121, "fps": 24.0, **change})
    assert request.worker_mp4_blocker(V30) is not None
    assert _settled(request) is False
    assert "preencode_mp4" not in (_sent(request) or {})


def test_a_value_already_set_is_kept_as_the_bench_sets_it():
    off = VideoRequest("a fox", fps=24.0, preencode=False)
    assert _settled(off) is False and _sent(off) is None      # False is upstream's default: nothing is sent
    on = VideoRequest("a fox", fps=24.0, preencode=True)
    settle(on, None, None)
    assert on.preencode is True and _sent(on) == {"preencode_mp4": True}


def test_a_raw_extra_params_switch_is_left_as_written():
    for raw in ('{"preencode_mp4": false}', '{"preencode_mp4": true, "flow_shift": 5}'):
        request = VideoRequest("a fox", fps=24.0, extra={"extra_params": raw})
        assert _settled(request) is None and _sent(request) == json.loads(raw)


def test_the_switch_merges_with_the_sampler_and_raw_extra_params():
    request = VideoRequest("a", sampler="euler", preencode=True, extra={"extra_params": '{"flow_shift": 12}'})
    assert _sent(request) == {"flow_shift": 12, "sample_solver": "euler", "preencode_mp4": True}
    raw_only = VideoRequest("a", extra={"extra_params": '{"preencode_mp4": true}'})
    assert _sent(raw_only) == {"preencode_mp4": True}          # undecided: the raw field goes as written


@pytest.mark.parametrize("request_, setting, words", [
    (VideoRequest("a", preencode=False, extra={"extra_params": '{"preencode_mp4": true}'}), "extra",
     "Two values were given for preencode_mp4"),
    (VideoRequest("a", preencode=True, interpolation=FrameInterpolation("/srv/rife")), "extra",
     "cannot serve this request"),
    (VideoRequest("a", preencode=True, fps=29.97), "extra", "cannot serve this request"),
])
def test_a_request_the_switch_cannot_serve_is_refused_before_sending(request_, setting, words):
    with pytest.raises(LauncherError) as err:
        request_.form_fields(V30)
    assert err.value.setting == setting and words in str(err.value)


def test_an_explicit_switch_is_refused_for_a_0_26_server():
    with pytest.raises(LauncherError) as err:
        VideoRequest("a", preencode=True).form_fields(V26)
    assert "0.26 has no worker-side MP4" in str(err.value)

