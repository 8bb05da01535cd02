"""A FLOAT input given an integer too large for a float (JSON allows 1e400 written as digits) is
refused with the node's message for that input, not an OverflowError; ordinary numbers pass."""
from __future__ import annotations

from fractions import Fraction

import pytest

from vllm_omni_launcher.errors import LauncherError
from vllm_omni_launcher.models import FAMILIES
from vllm_omni_launcher.nodes import NODES
from vllm_omni_launcher.nodes.handles import ModelChoice
from vllm_omni_launcher.nodes.schema import Input, check_inputs

STRENGTH = Input("strength", "FLOAT", "a strength", opts={"min": 0.0, "max": 4.0})
FREE = Input("scale", "FLOAT", "a number without bounds")


@pytest.mark.parametrize("value", [10 ** 400, -(10 ** 400), Fraction(10 ** 400, 3)], ids=["huge", "-huge", "fraction"])
def test_a_number_beyond_a_float_is_refused_naming_the_input(value):
    for spec in (STRENGTH, FREE):
        with pytest.raises(LauncherError) as err:
            check_inputs("Some Node", [spec], {spec.name: value})
        assert err.value.setting == spec.name and "takes a finite number" in err.value.why


def test_through_a_real_node_too():
    ti2v = FAMILIES["ti2v_5b"].hf_id
    with pytest.raises(LauncherError) as err:
        NODES["VLLMOmniLora"].call({"model": ModelChoice(ti2v, "ti2v_5b", ti2v), "lora_name": "x.safetensors",
                                    "strength": 10 ** 400, "expert": "both"})
    assert err.value.setting == "strength"


def test_ordinary_numbers_still_pass():
    assert check_inputs("Some Node", [STRENGTH], {"strength": 2}) == {"strength": 2.0}
    assert check_inputs("Some Node", [FREE], {"scale": 10 ** 300}) == {"scale": 1e300}
    assert check_inputs("Some Node", [FREE], {"scale": Fraction(1, 2)}) == {"scale": 0.5}
