"""Every value a workflow can give any node is checked with the launcher's own message, before the node runs.

ComfyUI's /prompt lets NaN through a FLOAT's min/max, bool()s anything for a BOOLEAN, passes any
literal to a custom-typed input, and checks nothing that arrives through a link. Here every input
of every node in NODES gets NaN, inf, -inf, a string for a number, a list, None and
other wrong types: the answer is a LauncherError naming the node, the input and what it takes;
never a raw exception; and nothing is sent to a server or started. The request layer below the
nodes (models.request_for, VideoRequest.form_fields: what the CLI uses too) refuses the same
values, so "nan" is never sent. Every node runs through `Node.call` (nodes/v3.py's execute), so
these calls are what ComfyUI's execute does.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from vllm_omni_launcher.client import transport
from vllm_omni_launcher.client.api import VideoClient
from vllm_omni_launcher.client.request import VideoRequest
from vllm_omni_launcher.errors import LauncherError
from vllm_omni_launcher.models import FAMILIES, request_for
from comfy_standin import run_node
from vllm_omni_launcher.nodes import NODES
from vllm_omni_launcher.nodes.schema import Input
from vllm_omni_launcher.nodes.handles import (MODEL_TYPE, SERVER_TYPE, SERVING_TYPE, ModelChoice, ServerHandle,
                                              ServingChoice)
from vllm_omni_launcher.server import registry

TI2V = FAMILIES["ti2v_5b"]
NAN, INF = float("nan"), float("inf")
GOOD_LINKS: dict[str, Any] = {
    SERVER_TYPE: ServerHandle("remote", "http://127.0.0.1:9", TI2V.hf_id, TI2V.key),
    MODEL_TYPE: ModelChoice(TI2V.hf_id, TI2V.key, TI2V.hf_id),
    SERVING_TYPE: ServingChoice(),
    "IMAGE": np.zeros((1, 8, 8, 3), np.float32),
    "AUDIO": {"waveform": np.zeros((1, 1, 16000), np.float32), "sample_rate": 16000},
}
WRONG_FOR_NUMBERS = [NAN, INF, -INF, "2", [1, 0], None, True, {"__value__": [1]}]


def good_value(spec: Input) -> Any:
    if spec.kind == "COMBO":
        choices = spec.choices()
        return spec.default if spec.default is not None else (choices[0] if choices else "any.safetensors")
    if spec.kind in GOOD_LINKS:
        return GOOD_LINKS[spec.kind]
    return spec.default if spec.default is not None else {"INT": 1, "FLOAT": 1.0, "STRING": "a fox"}[spec.kind]


def bad_values(spec: Input) -> list[Any]:
    kind, opts, optional = spec.kind, spec.opts, spec.optional
    if kind == "INT":
        return [*WRONG_FOR_NUMBERS, 2.5, opts.get("max", 10**9) + 1 if "max" in opts else opts.get("min", 0) - 1]
    if kind == "FLOAT":
        return [*WRONG_FOR_NUMBERS, opts["max"] + 1.0 if "max" in opts else -1e300]
    if kind == "STRING":
        return [12, 1.5, ["a"], None, True]
    if kind == "BOOLEAN":
        return ["false", 1, 0.0, None, [True]]
    if kind == "COMBO":
        return [3, NAN, None, ["x"], True] + ([] if spec.own_choice else ["not-an-entry"])
    wrong = ["http://evil.example:8091", 5, NAN, ["1", 0], {"url": "x"}]
    if kind == "IMAGE":
        wrong += [np.zeros((8, 8)), np.zeros((0, 8, 8, 3))]
    if kind == "AUDIO":
        wrong += [np.zeros((1, 1, 16)), {"waveform": np.zeros((1, 16)), "sample_rate": 16000},
                  {"waveform": np.zeros((1, 1, 16)), "sample_rate": 0}, {"waveform": np.zeros((1, 1, 16))}]
    return wrong if optional else [*wrong, None]


def cases() -> list[Any]:
    out = []
    for node_id, node in NODES.items():
        for spec in node.inputs():
            for i, value in enumerate(bad_values(spec)):
                out.append(pytest.param(node_id, spec.name, value, id=f"{node_id}-{spec.name}-{i}"))
    return out


@pytest.fixture
def nothing_leaves(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Records any HTTP request or server start (there must be none)."""
    sent: list[Any] = []
    monkeypatch.setattr(transport.Transport, "request", lambda self, *a, **k: sent.append(("http", a)))
    monkeypatch.setattr(registry, "get_or_start", lambda *a, **k: sent.append(("start", a)))
    return sent


def inputs_of(node_id: str) -> dict[str, Any]:
    return {spec.name: good_value(spec) for spec in NODES[node_id].inputs() if not spec.optional}


@pytest.mark.parametrize("node_id, name, value", cases())
def test_every_input_of_every_node_refuses_wrong_values_with_our_message(nothing_leaves, node_id, name,
                                                                         value) -> None:
    values = {**inputs_of(node_id), name: value}
    with pytest.raises(LauncherError) as info:
        run_node(node_id, **values)
    err = info.value
    assert err.what.startswith(f"{NODES[node_id].display_name}: input '{name}' got"), err.what
    assert err.setting == name and f"'{name}' takes" in err.why and name in err.fix
    assert nothing_leaves == [], "nothing is sent or started for a refused value"


def test_a_literal_combo_value_outside_its_list_is_refused_at_prompt_time_with_our_message() -> None:
    for node_id, node in NODES.items():
        for spec in (s for s in node.inputs() if s.kind == "COMBO"):
            refusal = node.validate({spec.name: "not-an-entry"})
            assert isinstance(refusal, str) and "not-an-entry" in refusal, (node_id, spec.name)
        if all(good_value(s) in s.choices() for s in node.inputs() if s.kind == "COMBO"):
            assert node.validate(inputs_of(node_id)) is True, node_id       # (no LoRA on this machine)
        assert node.validate({}) is True, node_id                  # linked or absent: checked when it runs


def test_a_string_parallel_degree_gets_our_message_and_a_whole_float_is_taken(nothing_leaves) -> None:
    with pytest.raises(LauncherError) as info:
        run_node("VLLMOmniServingConfig", **{**inputs_of("VLLMOmniServingConfig"), "parallel_degree": "2"})
    assert "'parallel_degree' takes a whole number from 1 to 8" in info.value.why
    (choice,) = run_node("VLLMOmniServingConfig", **{**inputs_of("VLLMOmniServingConfig"), "parallel_degree": 2.0})
    assert choice.parallel_degree == 2 and isinstance(choice.parallel_degree, int)


def test_a_missing_required_input_and_an_unknown_one_are_named(nothing_leaves) -> None:
    values = inputs_of("VLLMOmniServingConfig")
    del values["offload"]
    with pytest.raises(LauncherError) as info:
        run_node("VLLMOmniServingConfig", **values)
    assert info.value.setting == "offload" and "missing" in info.value.what
    with pytest.raises(LauncherError) as info:
        run_node("VLLMOmniServingConfig", **inputs_of("VLLMOmniServingConfig"), gpu_memory_utilization=0.9)
    assert info.value.setting == "gpu_memory_utilization" and "has no input" in info.value.what


@pytest.mark.parametrize("field, value", [("guidance", NAN), ("guidance_2", INF), ("flow_shift", NAN),
                                          ("boundary_ratio", -INF), ("fps", NAN), ("width", "832"),
                                          ("steps", [4]), ("seed", 1.5), ("frames", INF)])
def test_the_request_layer_refuses_them_too(field, value) -> None:
    with pytest.raises(LauncherError) as info:
        request_for(FAMILIES["t2v_a14b"], prompt="a fox", **{field: value})
    assert info.value.setting == field


@pytest.mark.parametrize("field", ["guidance", "guidance_2", "boundary_ratio", "flow_shift", "width", "seed",
                                   "fps", "num_frames"])
def test_nan_is_never_sent_as_text(field, nothing_leaves) -> None:
    setting = {"num_frames": "frames"}.get(field, field)
    with pytest.raises(LauncherError) as info:
        VideoRequest("a fox", **{field: NAN})
    assert info.value.setting == setting
    request = VideoRequest("a fox", num_frames=9)
    setattr(request, field, NAN)                         # changed after it was made: still never sent
    with pytest.raises(LauncherError) as info:
        request.form_fields()
    assert info.value.setting == setting
    with pytest.raises(LauncherError):
        VideoClient("http://127.0.0.1:9").submit(request)
    assert nothing_leaves == []
