"""Load Model's list: Wan2.2 Diffusers folders under ComfyUI's models/diffusers are found at any
depth and offered by their path relative to it (never an absolute path), next to the presets; any
other value, existing folder or not, is refused with one message naming the widget.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from comfy_standin import run_node
from vllm_omni_launcher.errors import LauncherError
from vllm_omni_launcher.models import FAMILIES, find_local_models
from vllm_omni_launcher.nodes import NODES, comfy_bridge
from vllm_omni_launcher.server.config.config_values import shown

TI2V_INDEX = {"_class_name": "WanPipeline", "expand_timesteps": True}
T2V_INDEX = {"_class_name": "WanPipeline"}
I2V_INDEX = {"_class_name": "WanImageToVideoPipeline"}


def _model_dir(path: Path, index: dict) -> Path:
    path.mkdir(parents=True)
    (path / "model_index.json").write_text(json.dumps(index))
    (path / "transformer").mkdir()
    return path


@pytest.fixture
def diffusers(tmp_path, monkeypatch) -> Path:
    root = tmp_path / "models" / "diffusers"
    _model_dir(root / "Wan-AI" / "Wan2.2-TI2V-5B-Diffusers", TI2V_INDEX)   # huggingface-cli --local-dir layout
    _model_dir(root / "t2v", T2V_INDEX)
    _model_dir(root / "a" / "b" / "c" / "my-i2v-finetune", I2V_INDEX)
    _model_dir(root / "sdxl", {"_class_name": "StableDiffusionXLPipeline"})  # not Wan: not listed
    _model_dir(root / ".cache" / "hidden", TI2V_INDEX)                       # hidden folders are skipped
    (root / "a" / "loop").symlink_to(root, target_is_directory=True)         # a link back up the tree
    monkeypatch.setattr(comfy_bridge, "diffusers_folders", lambda: [root])
    return root


def test_local_models_are_found_at_any_depth_labelled_by_relative_path(diffusers):
    found = find_local_models([diffusers])
    assert {label: m.family.key for label, m in found.items()} == {
        "local/Wan-AI/Wan2.2-TI2V-5B-Diffusers": "ti2v_5b",
        "local/t2v": "t2v_a14b",
        "local/a/b/c/my-i2v-finetune": "i2v_a14b",
    }
    assert found["local/t2v"].path == diffusers / "t2v"


def test_load_model_offers_presets_and_local_labels_and_accepts_them(diffusers):
    node = NODES["VLLMOmniLoadModel"]
    options = node.inputs()[0].choices()
    assert options[:3] == [f.hf_id for f in FAMILIES.values()]
    assert "local/Wan-AI/Wan2.2-TI2V-5B-Diffusers" in options
    assert not any(str(diffusers) in o or o.startswith("/") for o in options), "no absolute path in the list"
    assert node.validate({"model": "local/Wan-AI/Wan2.2-TI2V-5B-Diffusers"}) is True     # checked at /prompt
    assert "not one of Load Model's choices" in node.validate({"model": "local/missing"})
    choice = run_node("VLLMOmniLoadModel", "local/Wan-AI/Wan2.2-TI2V-5B-Diffusers")[0]
    assert choice.model == str(diffusers / "Wan-AI" / "Wan2.2-TI2V-5B-Diffusers") and choice.family_key == "ti2v_5b"
    assert choice.label == "local/Wan-AI/Wan2.2-TI2V-5B-Diffusers"
    preset = run_node("VLLMOmniLoadModel", "Wan-AI/Wan2.2-I2V-A14B-Diffusers")[0]
    assert (preset.model, preset.family_key) == ("Wan-AI/Wan2.2-I2V-A14B-Diffusers", "i2v_a14b")


def test_load_model_refuses_anything_else_with_one_message_whether_or_not_it_exists(diffusers, tmp_path):
    existing = str(diffusers / "t2v")               # a real Wan folder, given as a path
    tries = [existing, str(tmp_path / "does-not-exist"), "~/../../x", "local/missing", "local/../t2v",
             "local/sdxl", "wan-ai/wan2.2-ti2v-5b-diffusers "]
    errors = []
    for name in tries:
        with pytest.raises(LauncherError) as err:
            run_node("VLLMOmniLoadModel", name)
        errors.append(err.value)
    assert {(e.why, e.fix, e.setting) for e in errors} == {(errors[0].why, errors[0].fix, "model")}
    assert all(e.what == f"Load Model got {shown(name)}, which is not one of Load Model's choices on this machine"
               for e, name in zip(errors, tries))
