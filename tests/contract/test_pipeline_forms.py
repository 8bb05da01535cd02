"""The forms the launcher makes for VACE, speech-to-video and FastWan, read by the REAL vLLM-Omni 0.30
parser and handed to the pipelines' own pre-processing (server environment, no GPU).

docs/wan-pipelines.md relies on every fact asserted here. The bodies are the exact bytes the client
sends (``requests`` prepares them from ``VideoRequest.form_fields``, as client/transport.py does); all
cases are answered at once by ``pipeline_form_probe.probe`` (what it runs of upstream and what it
replaces: see there), inside the session's resolver process (``upstream_resolver``), beside the
launch command of each family through the real parser and config resolution (fixture Hub configs:
tests/contract/fixtures/hf; the S2V one is a stand-in with the original layout's root config.json).
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
from vllm_omni_launcher.models import FAMILIES, PIPELINE_FAMILIES, request_for
from vllm_omni_launcher.server.launch.spec import LaunchSpec

VACE, S2V, FAST = PIPELINE_FAMILIES["vace_1_3b"], PIPELINE_FAMILIES["s2v_14b"], PIPELINE_FAMILIES["fastwan_ti2v_5b"]
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


@pytest.fixture(scope="module")
def answers(upstream_resolver) -> dict:
    control = media.control_video_from_frames(_smooth(17, 480, 832))
    refs = media.reference_images_from_batch(_smooth(2, 300, 200), 832, 480)
    face = _smooth(1, 448, 832)[0]
    portrait = image_to_png(face)
    speech = media.audio_clip(np.sin(np.arange(16000 * 3) / 5.0)[None].astype(np.float32), 16000)
    vace_control = request_for(VACE, prompt="a dancer", frames=17, control_video=control).form_fields()
    oversized = {"prompt": "x", "num_frames": "80", "fps": "16",
                 "input_reference": ("image.png", portrait, "image/png"),
                 "audio_reference": json.dumps({"audio_url": "data:audio/wav;base64,"
                                                + base64.b64encode(b"\0" * (800 << 10)).decode()})}
    cases = [
        _case("vace_control", VACE, vace_control),
        _case("vace_refs", VACE, request_for(VACE, prompt="a cat", reference_images=refs).form_fields()),
        _case("s2v", S2V, request_for(S2V, prompt="a singer", image=face, audio=speech).form_fields()),
        _case("fastwan", FAST, request_for(FAST, prompt="a fox").form_fields()),
        # the speed-lever bench's `preencode` request (bench/gpu/levers.py), on plain TI2V-5B
        _case("ti2v_preencode", FAMILIES["ti2v_5b"], levers.Levers.request(
            SimpleNamespace(a=SimpleNamespace(width=1280, height=704, frames=121, seed=1)), 4, "preencode").form_fields()),
        # What the launcher refuses itself, sent anyway: upstream's own answers.
        _case("vace_control_and_refs", VACE, {**vace_control, "image_reference": media.reference_images_value(refs)}),
        _case("s2v_audio_over_1mib", S2V, oversized),
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


def test_the_preencode_lever_reaches_the_wan_pipeline_as_its_worker_side_mp4_switch(answers):
    case = answers["cases"]["ti2v_preencode"]
    assert case["status"] == 200, case
    assert "preencode_mp4" in case["extra_args"] and case["preencode_mp4"] is True
    assert answers["cases"]["fastwan"]["preencode_mp4"] is False          # nothing else the launcher sends sets it
