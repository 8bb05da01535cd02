"""A workflow may put any JSON in a combo: a number, a bool, a list, an object. Every combo of every
node refuses such a value with the node's own message (node, input, what it got, what it takes),
at /prompt (`Node.validate`, ComfyUI's validate_inputs) and when the node runs (`Node.call`, V3's
execute), never with a TypeError or AttributeError traceback; listed text entries still pass."""
from __future__ import annotations

import pytest

from vllm_omni_launcher.errors import LauncherError
from vllm_omni_launcher.models import FAMILIES
from vllm_omni_launcher.nodes import NODES
from vllm_omni_launcher.nodes.handles import ModelChoice
from vllm_omni_launcher.nodes.model_nodes import choose_model, lora_path

NOT_TEXT = [5, 1.5, True, {"a": 1}, ["x"], ["1", 0]]
COMBOS = [(node_id, spec.name) for node_id, node in NODES.items() for spec in node.inputs() if spec.kind == "COMBO"]
TI2V = FAMILIES["ti2v_5b"].hf_id


def test_the_nodes_the_audit_named_have_list_checked_combos():
    assert {("VLLMOmniLoadModel", "model"), ("VLLMOmniLoadPipelineModel", "model"),
            ("VLLMOmniLora", "lora_name")} <= set(COMBOS)


@pytest.mark.parametrize("node_id, name", COMBOS)
@pytest.mark.parametrize("value", NOT_TEXT, ids=repr)
def test_validate_refuses_a_combo_value_that_is_not_text(node_id, name, value):
    node = NODES[node_id]
    message = node.validate({name: value})
    assert isinstance(message, str) and f"{node.display_name}: input '{name}' got" in message
    assert f"set '{name}' to" in message


@pytest.mark.parametrize("node_id, extra", [("VLLMOmniLoadModel", {}), ("VLLMOmniLoadPipelineModel", {}),
                                            ("VLLMOmniLora", {"model": ModelChoice(TI2V, "ti2v_5b", TI2V)})])
@pytest.mark.parametrize("value", NOT_TEXT, ids=repr)
def test_running_the_node_refuses_it_the_same_way(node_id, extra, value):
    node = NODES[node_id]
    name = "lora_name" if node_id == "VLLMOmniLora" else "model"
    with pytest.raises(LauncherError) as err:
        node.call({**extra, name: value})
    assert err.value.setting == name and err.value.what.startswith(f"{node.display_name}: input '{name}' got")


@pytest.mark.parametrize("value", NOT_TEXT, ids=repr)
def test_the_entry_checks_themselves_refuse_it_with_their_one_message(value):
    """choose_model / lora_path are the nodes' `choose`: given a non-text value directly (no
    schema check in front), they still answer with their message, not a TypeError."""
    for choose, setting in ((choose_model, "model"), (lora_path, "lora_name")):
        with pytest.raises(LauncherError) as err:
            choose(value)
        assert err.value.setting == setting and "choices on this machine" in err.value.what


def test_a_listed_entry_still_passes_both_checks():
    node = NODES["VLLMOmniLoadModel"]
    assert node.validate({"model": TI2V}) is True
    (choice,) = node.call({"model": TI2V})
    assert (choice.model, choice.family_key, choice.label) == (TI2V, "ti2v_5b", TI2V)
    assert NODES["VLLMOmniLora"].validate({"expert": "both"}) is True
