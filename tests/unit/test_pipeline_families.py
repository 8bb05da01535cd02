"""The pipeline families (VACE, speech-to-video, step-distilled FastWan) recognised from a repo id or a
folder, kept out of Load Model's Wan2.2 list, and launched with what they need (S2V's pipeline class,
the server line FastWan needs); their plans say they are not calibrated yet (docs/wan-pipelines.md)."""
from __future__ import annotations

import json

import pytest

from pipeline_media import refused
from vllm_omni_launcher.errors import SpecError
from vllm_omni_launcher.models import FAMILIES, PIPELINE_FAMILIES, family_for, family_of_folder
from vllm_omni_launcher.planner.memory import plan
from vllm_omni_launcher.server.launch.spec import LaunchSpec

S2V, FAST = PIPELINE_FAMILIES["s2v_14b"], PIPELINE_FAMILIES["fastwan_ti2v_5b"]


# ----------------------------------------------------------------------------- recognition
def test_the_three_base_families_and_their_dropdowns_stay_as_released():
    assert list(FAMILIES) == ["t2v_a14b", "i2v_a14b", "ti2v_5b"]
    assert not set(FAMILIES) & set(PIPELINE_FAMILIES)


@pytest.mark.parametrize("hf_id,key", [("Wan-AI/Wan2.1-VACE-14B-diffusers", "vace_14b"),
                                       ("wan-ai/wan2.1-vace-1.3b-diffusers", "vace_1_3b"),
                                       ("Wan-AI/Wan2.2-S2V-14B", "s2v_14b"),
                                       ("FastVideo/FastWan2.2-TI2V-5B-FullAttn-Diffusers", "fastwan_ti2v_5b")])
def test_each_pipeline_repo_is_its_family(hf_id, key):
    assert family_for(hf_id).key == key


def _diffusers(tmp_path, cls: str, **transformer) -> object:
    (tmp_path / "transformer").mkdir()
    (tmp_path / "model_index.json").write_text(json.dumps({"_class_name": cls}))
    (tmp_path / "transformer" / "config.json").write_text(json.dumps(transformer))
    return tmp_path


def test_a_vace_folder_is_told_apart_by_its_transformer_shape(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    small = _diffusers(tmp_path / "a", "WanVACEPipeline", num_layers=30, num_attention_heads=12)
    big = _diffusers(tmp_path / "b", "WanVACEPipeline", num_layers=40, num_attention_heads=40)
    assert family_of_folder(small).key == "vace_1_3b" and family_of_folder(big).key == "vace_14b"


def test_a_fastwan_ti2v_folder_is_recognised_and_other_distilled_shapes_are_refused(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    assert family_of_folder(_diffusers(tmp_path / "a", "WanDMDPipeline", in_channels=48)).key == "fastwan_ti2v_5b"
    err = refused(lambda: family_of_folder(_diffusers(tmp_path / "b", "WanT2VDMD2Pipeline", in_channels=16)))
    assert "no shape for" in err.what and "FastWan2.2-TI2V-5B-FullAttn-Diffusers" in err.fix


def test_the_s2v_original_layout_without_model_index_is_recognised(tmp_path):
    (tmp_path / "wav2vec2-large-xlsr-53-english").mkdir()
    (tmp_path / "Wan2.1_VAE.pth").write_bytes(b"")
    (tmp_path / "config.json").write_text("{}")
    assert family_of_folder(tmp_path).key == "s2v_14b"


def test_load_model_lists_no_pipeline_folder_and_the_doctor_says_why(tmp_path):
    from vllm_omni_launcher.models import find_local_models

    (tmp_path / "vace").mkdir()
    _diffusers(tmp_path / "vace", "WanVACEPipeline", num_layers=30, num_attention_heads=12)
    skipped: dict[str, str] = {}
    assert find_local_models([tmp_path], skipped) == {}
    assert skipped == {str(tmp_path / "vace"): "a Wan2.1 VACE-1.3B model: not one of Load Model's Wan2.2 families"}
    assert find_local_models([tmp_path], pipelines=True)["local/vace"].family.key == "vace_1_3b"


def test_an_s2v_original_folder_is_found_only_among_pipeline_folders(tmp_path):
    from vllm_omni_launcher.models import find_local_models

    folder = tmp_path / "Wan-AI" / "Wan2.2-S2V-14B"
    (folder / "wav2vec2-large-xlsr-53-english").mkdir(parents=True)
    (folder / "Wan2.1_VAE.pth").write_bytes(b"")
    (folder / "config.json").write_text("{}")
    assert find_local_models([tmp_path]) == {}
    assert find_local_models([tmp_path], pipelines=True)["local/Wan-AI/Wan2.2-S2V-14B"].family.key == "s2v_14b"


# ----------------------------------------------------------------------------- launch
def test_s2v_is_launched_with_its_pipeline_class_once():
    assert LaunchSpec(model=S2V.hf_id).flags()[-2:] == ["--model-class-name", "WanS2VPipeline"]
    given = LaunchSpec(model=S2V.hf_id, extra_flags=("--model-class-name", "WanS2VPipeline"))
    assert given.flags().count("--model-class-name") == 1


def test_fastwan_is_refused_on_a_server_line_without_its_pipeline():
    assert LaunchSpec(model=FAST.hf_id).validate(version=(0, 30)) == []
    with pytest.raises(SpecError) as info:
        LaunchSpec(model=FAST.hf_id).validate(version=(0, 26))
    assert "needs vLLM-Omni 0.30" in info.value.what and info.value.setting == "model"


@pytest.mark.parametrize("family", [f for f in PIPELINE_FAMILIES.values() if f.min_version <= (0, 26)],
                         ids=lambda f: f.key)
def test_a_new_family_planned_for_0_26_says_it_was_measured_on_0_30_only(family):
    text = plan(LaunchSpec(model=family.hf_id), gpus=[141.0], server_version=(0, 26)).text()
    assert "UNCALIBRATED on vLLM-Omni 0.26" in text and family.label in text and "0.30 only" in text


@pytest.mark.parametrize("family", list(PIPELINE_FAMILIES.values()), ids=lambda f: f.key)
def test_a_new_family_planned_for_0_30_is_not_marked_uncalibrated(family):
    assert "UNCALIBRATED" not in plan(LaunchSpec(model=family.hf_id), gpus=[141.0], server_version=(0, 30)).text()


def test_the_plan_of_a_measured_family_is_not_marked_uncalibrated():
    assert "UNCALIBRATED" not in plan(LaunchSpec(model=FAMILIES["ti2v_5b"].hf_id), gpus=[141.0]).text()

