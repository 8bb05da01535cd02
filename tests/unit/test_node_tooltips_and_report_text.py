"""What every node shows the user: a description, a tooltip on every input and output (saying what
0 or -1 means where a widget takes the model's value), and the report nodes' text on the node,
in their output and in the history.
"""
from __future__ import annotations

from comfy_standin import ComfyStandIn, run_node
from vllm_omni_launcher.nodes import NODES


def test_every_input_and_output_has_a_tooltip_and_every_node_a_description():
    for node_id, node in NODES.items():
        assert node.description, node_id
        for spec in node.inputs():
            tip = spec.tooltip
            assert tip, f"{node_id}.{spec.name} has no tooltip"
            if "min" in spec.opts and "recommended" in tip:
                marker = "-1 =" if spec.opts["min"] < 0 else "0 ="
                assert marker in tip and ("0 or -1" not in tip), f"{node_id}.{spec.name}: {tip}"
        assert node.outputs and all(o.tooltip for o in node.outputs), node_id


def test_report_nodes_take_the_node_id_to_show_their_text():
    for node_id in ("VLLMOmniStopServer", "VLLMOmniServerStatus", "VLLMOmniDoctor", "VLLMOmniLocalServer",
                    "VLLMOmniRemoteServer", "VLLMOmniGenerateVideo"):
        assert "unique_id" in NODES[node_id].hidden


def test_status_and_stop_text_reaches_the_node_the_output_and_the_history():
    with ComfyStandIn() as comfy:
        out = run_node("VLLMOmniServerStatus", unique_id="7")
        stop = run_node("VLLMOmniStopServer", stop_all=False, unique_id="8")
    assert out == ("No launcher-started server is running.",) and NODES["VLLMOmniServerStatus"].shows_text
    assert stop == ("No launcher-started server was running.",) and NODES["VLLMOmniStopServer"].shows_text
    assert comfy.texts == [(out[0], "7"), (stop[0], "8")]     # send_progress_text
