"""The `Wan2.2 A14B 4-step LoRA` template and Generate's sampler / interpolation widgets (issue 13)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from comfy_standin import run_node
from vllm_omni_launcher.errors import LauncherError
from vllm_omni_launcher.nodes import NODES, session
from vllm_omni_launcher.nodes.handles import ServerHandle

REPO = Path(__file__).resolve().parents[2]
NAME = "wan22_t2v_a14b_4step_lora"


def _api() -> dict:
    return json.loads((REPO / "workflows" / "api" / f"{NAME}.api.json").read_text())


def test_distill_template_chains_a_high_and_a_low_noise_lora_into_local_server():
    api = _api()
    by_type = {}
    for key, node in api.items():
        by_type.setdefault(node["class_type"], []).append((key, node))
    loras = dict(by_type["VLLMOmniLora"])
    assert sorted(n["inputs"]["expert"] for n in loras.values()) == ["high_noise", "low_noise"]
    assert all(n["inputs"]["strength"] == 1 for n in loras.values())      # fused: the file's own scale
    (server_key, server), = by_type["VLLMOmniLocalServer"]
    last = loras[server["inputs"]["model"][0]]                             # Load Model -> LoRA -> LoRA -> server
    first = loras[last["inputs"]["model"][0]]
    assert api[first["inputs"]["model"][0]]["class_type"] == "VLLMOmniLoadModel"
    assert api[first["inputs"]["model"][0]]["inputs"]["model"] == "Wan-AI/Wan2.2-T2V-A14B-Diffusers"


def test_distill_template_runs_4_steps_guidance_1_on_both_experts_euler_on_ulysses():
    api = _api()
    gen = next(n["inputs"] for n in api.values() if n["class_type"] == "VLLMOmniGenerateVideo")
    assert (gen["steps"], gen["guidance"], gen["guidance_2"], gen["sampler"]) == (4, 1, 1, "euler")
    serving = next(n["inputs"] for n in api.values() if n["class_type"] == "VLLMOmniServingConfig")
    assert serving["parallel_mode"] == "ulysses"                           # CFG parallel would idle at guidance 1


def test_interpolation_widgets_need_a_listed_rife_folder(tmp_path, monkeypatch):
    assert session.interpolation_for("off", session.NO_MODEL) is None
    (tmp_path / "rife").mkdir()
    (tmp_path / "rife" / "flownet.pkl").write_bytes(b"x")
    monkeypatch.setattr(session.comfy_bridge, "interpolation_models", lambda: {"rife": tmp_path / "rife"})
    x4 = session.interpolation_for("x4", "rife")
    assert (x4.exp, x4.multiplier, x4.model_path) == (2, 4, str(tmp_path / "rife"))
    for model in (session.NO_MODEL, "/etc"):
        with pytest.raises(LauncherError) as err:
            session.interpolation_for("x2", model)
        assert err.value.what == (f'interpolation_model got the string "{model}", which is not an available frame '
                                  "interpolation model")


@pytest.mark.parametrize("node_id", ["VLLMOmniGenerateVideo", "VLLMOmniGenerateBatch"])
def test_an_unknown_interpolation_choice_is_refused_by_the_nodes_input_check(node_id, monkeypatch):
    # interpolation_for takes INTERPOLATION's keys only: the node's input check (nodes/schema.py) refuses
    # any other value, linked ones included, before the node's work begins
    monkeypatch.setattr(session, "build_request", lambda *a, **k: pytest.fail("the node ran"))
    values = {i.name: i.default for i in NODES[node_id].inputs() if not i.optional or i.default is not None}
    values.update(server=ServerHandle("remote", "http://127.0.0.1:1", "m", "ti2v_5b"), frame_interpolation="x3")
    values["prompts" if "prompts" in values else "prompt"] = "a fox"
    with pytest.raises(LauncherError) as err:
        run_node(node_id, **values)
    name = NODES[node_id].display_name
    assert (err.value.what, err.value.why) == (f"{name}: input 'frame_interpolation' got the string \"x3\"",
                                               "'frame_interpolation' takes one of: off, x2, x4")
    assert err.value.setting == "frame_interpolation"
