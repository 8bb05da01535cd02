"""The shipped templates read in ComfyUI without scrolling or overlap: each Note is tall enough for
its text, no node's title bar or source badge sits on another node, and each opens at a zoom where the
front end draws node text; the compile tooltip says what was measured in plain sentences."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from vllm_omni_launcher.planner.launch_plan import ServingChoice
from vllm_omni_launcher.server.config.settings import settings_of

WORKFLOWS = Path(__file__).resolve().parents[2] / "workflows"
TEMPLATES = sorted(p.stem for p in WORKFLOWS.glob("*.json"))
CHARS_PER_LINE, UNITS_PER_LINE = 68, 16     # Note's monospace text at width 460, as ComfyUI 0.3.64 draws it
TITLE_AND_BADGE = 30 + 20                   # LiteGraph's title bar, and the front end's node-source badge above it


def _nodes(name: str) -> list[dict]:
    return json.loads((WORKFLOWS / f"{name}.json").read_text())["nodes"]


def _readable_zoom() -> float:
    """make_workflows.py's floor for the saved view (declared with the template descriptions)."""
    path = Path(__file__).resolve().parents[1] / "comfyui" / "template_specs.py"
    spec = importlib.util.spec_from_file_location("template_specs", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.READABLE_ZOOM


@pytest.mark.parametrize("name", TEMPLATES)
def test_each_template_opens_at_a_zoom_that_draws_node_text(name):
    view = json.loads((WORKFLOWS / f"{name}.json").read_text())["extra"]["ds"]
    assert view["scale"] >= _readable_zoom(), view


@pytest.mark.parametrize("name", TEMPLATES)
def test_each_note_is_tall_enough_for_its_text(name):
    [note] = [n for n in _nodes(name) if n["type"] == "Note"]
    text = note["widgets_values"][0]
    lines = sum(max(1, -(-len(p) // CHARS_PER_LINE)) for p in text.split("\n"))
    assert note["size"][0] >= 460 and note["size"][1] >= UNITS_PER_LINE * lines, (note["size"], lines)


@pytest.mark.parametrize("name", TEMPLATES)
def test_no_title_bar_or_badge_sits_on_another_node(name):
    nodes = _nodes(name)
    for a in nodes:
        ax0, ay0 = a["pos"][0], a["pos"][1] - TITLE_AND_BADGE
        ax1, ay1 = a["pos"][0] + a["size"][0], a["pos"][1] + a["size"][1]
        for b in nodes:
            if b is a:
                continue
            bx0, by0 = b["pos"][0], b["pos"][1] - TITLE_AND_BADGE
            bx1, by1 = b["pos"][0] + b["size"][0], b["pos"][1] + b["size"][1]
            assert ax1 <= bx0 or bx1 <= ax0 or ay1 <= by0 or by1 <= ay0, f"{a['type']} overlaps {b['type']}"


def test_the_compile_tooltip_reads_as_sentences():
    help_text = {s.name: s.help for s in settings_of(ServingChoice)}["compile"]
    assert help_text == (
        "torch.compile (upstream's default, regional): the server starts slower for faster steps. Measured on one "
        "H200, TI2V-5B at 1280x704x121: vLLM-Omni 0.30 was ready about 13 s later (37 s against 22-26 s eager) and "
        "5.6% faster per step (1.66 against 1.76 s), which pays back after about 130 steps; 0.26 was ready in about "
        "127 s compiled against 40 s eager with no measurable gain, and T2V-A14B at 832x480x81 ready 24 s later and "
        "0.3 s faster per step. Off = enforce_eager")
