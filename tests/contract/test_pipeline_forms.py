"""The forms the launcher makes for VACE, speech-to-video and FastWan, read by the REAL vLLM-Omni 0.30
parser and handed to the pipelines' own pre-processing (server environment, no GPU).

docs/wan-pipelines.md relies on every fact asserted here. The bodies are the exact bytes the client
sends (``requests`` prepares them from ``VideoRequest.form_fields``, as client/transport.py does); all
cases are answered at once by ``pipeline_form_probe.probe`` (what it runs of upstream and what it
replaces: see there), inside the session's resolver process (``upstream_resolver``), beside the
launch command of each family through the real parser and config resolution (fixture Hub configs:
tests/contract/fixtures/hf; the S2V one is a stand-in with the original layout's root config.json).
The launcher's forms are settled as the nodes and the CLI settle them for a server they started from the
family's default launch on 0.30 (server/launch/worker_mp4.py: whether the job gets the worker-side MP4).
"""
from __future__ import annotations

import base64
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from pipeline_form_probe import case as _case
from vllm_omni_launcher.client import media
from vllm_omni_launcher.client.images import image_to_png
from vllm_omni_launcher.client.request import FrameInterpolation
from vllm_omni_launcher.models import FAMILIES, PIPELINE_FAMILIES, request_for
from vllm_omni_launcher.server.launch.spec import LaunchSpec
from vllm_omni_launcher.server.launch.worker_mp4 import settle

VACE, S2V, FAST = PIPELINE_FAMILIES["vace_1_3b"], PIPELINE_FAMILIES["s2v_14b"], PIPELINE_FAMILIES["fastwan_ti2v_5b"]
T2V, I2V, TI2V = FAMILIES["t2v_a14b"], FAMILIES["i2v_a14b"], FAMILIES["ti2v_5b"]
REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
try:
    from bench.gpu import levers
finally:
    sys.path.remove(str(REPO))      # the repo root holds top-level names (server, nodes) ComfyUI also uses


def _smooth(frames: int, height: int, width: int) -> np.ndarray:
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    return np.stack([np.stack([(x + 4 * i) % width / width, y / height, np.full_like(x, i / max(1, frames))], -1)
                     for i in range(frames)])


def _sent(family, request) -> dict:
    """The form the nodes / CLI send to a server they started from `family`'s default launch (vLLM-Omni 0.30)."""
    settle(request, LaunchSpec(model=family.hf_id), (0, 30))
    return request.form_fields()


@pytest.fixture(scope="module")
def answers(upstream_resolver) -> dict:
    control = media.control_video_from_frames(_smooth(17, 480, 832))
    face = _smooth(1, 448, 832)[0]
    portrait = image_to_png(face)
    speech = media.audio_clip(np.sin(np.arange(16000 * 3) / 5.0)[None].astype(np.float32), 16000)
    refs = request_for(VACE, prompt="a cat", reference_images=_smooth(2, 300, 200))     # made at its 832x480
    vace_control = _sent(VACE, request_for(VACE, prompt="a dancer", frames=17, control_video=control))
    oversized = {"prompt": "x", "num_frames": "80", "fps": "16",
                 "input_reference": ("image.png", portrait, "image/png"),
                 "audio_reference": json.dumps({"audio_url": "data:audio/wav;base64,"
                                                + base64.b64encode(b"\0" * (800 << 10)).decode()})}
    interpolated = request_for(TI2V, prompt="a fox")
    interpolated.interpolation = FrameInterpolation("/srv/rife", exp=1)
    bench = SimpleNamespace(a=SimpleNamespace(width=1280, height=704, frames=121, seed=1))
    cases = [
        _case("vace_control", VACE, vace_control),
        _case("vace_refs", VACE, _sent(VACE, refs)),
        _case("s2v", S2V, _sent(S2V, request_for(S2V, prompt="a singer", image=face, audio=speech))),
        _case("fastwan", FAST, _sent(FAST, request_for(FAST, prompt="a fox"))),
        _case("t2v", T2V, _sent(T2V, request_for(T2V, prompt="a fox"))),
        _case("i2v", I2V, _sent(I2V, request_for(I2V, prompt="a fox", image=_smooth(1, 480, 832)[0]))),
        _case("ti2v", TI2V, _sent(TI2V, request_for(TI2V, prompt="a fox"))),
        _case("ti2v_interpolated", TI2V, _sent(TI2V, interpolated)),
        # the speed-lever bench's `preencode` and `eager` requests (bench/gpu/levers.py), on plain TI2V-5B
        _case("ti2v_preencode", TI2V, levers.Levers.request(bench, 4, "preencode").form_fields()),
        _case("ti2v_eager", TI2V, levers.Levers.request(bench, 4, "eager").form_fields()),
        # What the launcher refuses itself, sent anyway: upstream's own answers.
        _case("vace_control_and_refs", VACE, {**vace_control,
                                              "image_reference": media.reference_images_value(refs.reference_images)}),
        _case("s2v_audio_over_1mib", S2V, oversized),
        _case("ti2v_preencode_interpolated", TI2V, {**interpolated.form_fields(),
                                                     "extra_params": json.dumps({"preencode_mp4": True})}),
    ]
    launches = [{"argv": ["serve", family.hf_id, *LaunchSpec(model=family.hf_id).flags()]}
                for family in PIPELINE_FAMILIES.values() if family.key != "vace_14b"]   # fixtures: the 1.3B
    answer, *resolved = upstream_resolver.resolve([{"call": "pipeline_form_probe:probe", "input": cases}, *launches],
                                                  timeout=900)
    assert "call_error" not in answer, answer.get("call_error")
    answer["launches"] = {case["argv"][1]: result for case, result in zip(launches, resolved)}
    return answer


def test_each_family_launch_command_resolves_to_its_pipeline(answers):
    classes = {model: result.get("config", {}).get("model_class_name") for model, result in answers["launches"].items()}
    assert classes == {VACE.hf_id: "WanVACEPipeline", S2V.hf_id: "WanS2VPipeline",
                       # the registry maps FastWan's class to Wan22Pipeline, which reads its model_index.json
                       # itself and runs the 3-step DMD schedule (pipeline_wan2_2.py:397-405)
                       FAST.hf_id: "WanPipeline"}


def test_every_new_family_is_in_the_0_30_pipeline_registry(answers):
    registry = answers["registry"]
    assert registry["WanVACEPipeline"][2] == "Wan22VACEPipeline"
    assert registry["WanS2VPipeline"][2] == "Wan22S2VPipeline"
    assert registry["WanDMDPipeline"][2] == "Wan22Pipeline"          # FastWan runs in Wan's own pipeline


def test_a_control_video_reaches_vace_as_its_source_video_frame_for_frame(answers):
    case = answers["cases"]["vace_control"]
    assert case["status"] == 200 and case["keys"] == ["video"]
    assert (case["video_frames"], case["video_item"], case["video_size"]) == (17, "Image", [832, 480])
    assert case["pre_process"]["source_video_frames"] == 17 and case["params"]["num_frames"] == 17


def test_several_references_reach_vace_as_reference_images_at_the_request_size(answers):
    case = answers["cases"]["vace_refs"]
    assert case["status"] == 200 and case["keys"] == ["image"]
    assert case["pre_process"]["reference_images"] == [[832, 480], [832, 480]]


def test_s2v_gets_its_portrait_and_the_audio_as_a_16khz_file(answers):
    case = answers["cases"]["s2v"]
    assert case["status"] == 200 and case["keys"] == ["audio", "image"]
    assert case["audio"] == {"rate": 16000, "samples": 48000, "is_file": True}
    assert case["pre_process"]["audio_path_set"] is True and "error" not in case["pre_process"]
    assert (case["params"]["num_frames"], case["params"]["fps"]) == (80, 16.0)


def test_fastwan_gets_the_three_steps_and_guidance_one_it_runs(answers):
    case = answers["cases"]["fastwan"]
    assert case["status"] == 200
    assert (case["params"]["num_inference_steps"], case["params"]["guidance_scale"]) == (3, 1.0)


def test_a_control_video_with_references_is_refused_by_upstream_too(answers):
    case = answers["cases"]["vace_control_and_refs"]
    assert case["status"] == 400 and "Provide only one of input_reference" in case["error"]["detail"]


def test_a_text_part_over_one_mebibyte_is_refused_by_upstream(answers):
    case = answers["cases"]["s2v_audio_over_1mib"]
    assert case["status"] == 400 and case["error"]["detail"] == "Part exceeded maximum size of 1024KB."
    assert media.FORM_TEXT_PART_MAX == 1 << 20


WORKER_MP4 = ("s2v", "fastwan", "t2v", "i2v", "ti2v")


def test_the_launchers_default_job_reaches_each_reading_pipeline_with_its_worker_side_mp4_on(answers):
    for name in WORKER_MP4:
        case = answers["cases"][name]
        assert case["status"] == 200, case
        assert "preencode_mp4" in case["extra_args"] and case["preencode_mp4"] is True, name


def test_vace_and_an_interpolated_job_do_not_carry_it(answers):
    for name in ("vace_control", "vace_refs", "ti2v_interpolated"):
        case = answers["cases"][name]
        assert case["status"] == 200, case
        assert "preencode_mp4" not in case["extra_args"] and case["preencode_mp4"] is False, name


def test_upstream_refuses_the_worker_side_mp4_with_frame_interpolation(answers):
    case = answers["cases"]["ti2v_preencode_interpolated"]
    assert case["status"] == 200 and "preencode_mp4" in case["extra_args"]
    assert case["preencode_mp4"].startswith("ValueError: preencode_mp4 cannot be combined with "
                                            "enable_frame_interpolation")


def test_the_bench_levers_keep_meaning_with_and_without_it(answers):
    on, off = answers["cases"]["ti2v_preencode"], answers["cases"]["ti2v_eager"]
    assert on["status"] == off["status"] == 200
    assert on["preencode_mp4"] is True
    assert off["preencode_mp4"] is False and "preencode_mp4" not in off["extra_args"]
