"""A combo refused at /prompt shows its message once, under its own input.

ComfyUI 0.3.64 (execution.py, validate_inputs) hands a V3 node's validate_inputs the inputs its signature
names and attaches the one string it returns to each of them; `attached` below is that rule, applied to the
classes nodes/v3.py builds. tests/comfyui runs the LoRA template against the real ComfyUI."""
from __future__ import annotations

import inspect
import json
import types
from pathlib import Path
from typing import Any

import pytest

from vllm_omni_launcher.errors import LauncherError
from vllm_omni_launcher.nodes import NODES, v3

WORKFLOWS = Path(__file__).resolve().parents[2] / "workflows" / "api"

# node_class touches only io.ComfyNode while it builds the class (the schema is made when ComfyUI asks)
PINNED_STANDIN = types.SimpleNamespace(io=types.SimpleNamespace(ComfyNode=type("ComfyNode", (), {})), ui=None)


def attached(node_id: str, workflow_inputs: dict[str, Any]) -> list[tuple[str, str]]:
    """(input, message) pairs ComfyUI would show for this node's literal inputs."""
    cls = v3.node_class(NODES[node_id], PINNED_STANDIN)
    validate = getattr(cls, "validate_inputs", None)
    if validate is None:
        return []
    named = inspect.getfullargspec(validate).args                  # how ComfyUI reads the signature
    given = {name: value for name, value in workflow_inputs.items() if name in named}
    result = validate(**given)
    return [] if result is True else [(name, result) for name in given]


def test_a_missing_lora_is_refused_under_lora_name_only():
    errors = attached("VLLMOmniLora", {"lora_name": "not-here.safetensors", "strength": 1.0, "expert": "high_noise"})
    assert [name for name, _ in errors] == ["lora_name"]
    assert '"not-here.safetensors"' in errors[0][1]


def test_a_missing_interpolation_model_is_refused_under_interpolation_model_only():
    errors = attached("VLLMOmniGenerateVideo", {"sampler": "euler", "frame_interpolation": "x2",
                                                "interpolation_model": "no-rife-here"})
    assert [name for name, _ in errors] == ["interpolation_model"]


@pytest.mark.parametrize("node_id", sorted(NODES))
def test_every_node_names_at_most_one_input_to_validate_inputs(node_id):
    # two named inputs would show one input's message under the other as well
    assert len(v3.prompt_checked(NODES[node_id])) <= 1


@pytest.mark.parametrize("node_id", sorted(NODES))
def test_the_named_input_is_a_combo_of_this_machines_entries(node_id):
    for name in v3.prompt_checked(NODES[node_id]):
        spec = next(i for i in NODES[node_id].inputs() if i.name == name)
        assert spec.kind == "COMBO" and spec.own_choice, (node_id, name)


def test_a_fixed_list_combo_outside_its_list_is_refused_when_the_node_runs():
    template = json.loads((WORKFLOWS / "wan22_t2v_a14b_4step_lora.api.json").read_text())
    serving = next(e["inputs"] for e in template.values() if e["class_type"] == "VLLMOmniServingConfig")
    assert attached("VLLMOmniServingConfig", {**serving, "parallel_mode": "warp"}) == []   # not at /prompt ...
    with pytest.raises(LauncherError) as err:                                               # ... but when it runs
        NODES["VLLMOmniServingConfig"].call({**serving, "parallel_mode": "warp"})
    assert err.value.setting == "parallel_mode" and '"warp"' in err.value.what
