"""Each numeric request field's range is declared once (client/request_fields.py) and every surface takes it
from there: the nodes' widgets, the command line's checks, the core's refusal before anything is sent and the
fix given when the server refuses a value; the tooltips show the families' own defaults and the media caps."""
from __future__ import annotations

import ast
import subprocess
from pathlib import Path

import pytest

from vllm_omni_launcher.cli import build_parser
from vllm_omni_launcher.cli.report import for_command_line, option_flags
from vllm_omni_launcher.client import media
from vllm_omni_launcher.client.http_errors import FIELD_LIMITS
from vllm_omni_launcher.errors import LauncherError
from vllm_omni_launcher.models import (FAMILIES, PIPELINE_FAMILIES, REQUEST_FIELDS, S2V_FRAMES_PER_CLIP_MAX, SEED,
                                       request_for)
from vllm_omni_launcher.nodes import NODES

UPSTREAM_PROTOCOL = "vllm_omni/entrypoints/openai/protocol/videos.py"
# The widgets as released (saved workflows hold their values by position): name -> (min, max).
RELEASED_GENERATE = {"width": (0, 4096), "height": (0, 4096), "frames": (0, 1025), "fps": (0.0, 120.0),
                     "steps": (0, 200), "guidance": (-1.0, 20.0), "guidance_2": (-1.0, 20.0),
                     "boundary_ratio": (-1.0, 1.0), "flow_shift": (-1.0, 50.0), "seed": (0, 2**63 - 1)}
RELEASED_PIPELINE = {"width": (0, 1280), "height": (0, 1280), "steps": (0, 200), "guidance": (-1.0, 20.0),
                     "seed": (0, 2**63 - 1)}
T2V = FAMILIES["t2v_a14b"]


def _inputs(node_id: str) -> dict:
    return {i.name: i for i in NODES[node_id].inputs()}


# --------------------------------------------------------------------------- one declaration
def test_each_field_is_within_upstreams_range():
    for field in REQUEST_FIELDS.values():
        low, high = field.upstream
        assert low is None or field.low >= low, field.name
        assert high is None or field.high <= high, field.name
    assert (REQUEST_FIELDS["steps"].low, REQUEST_FIELDS["steps"].high) == REQUEST_FIELDS["steps"].upstream == (1, 200)
    assert REQUEST_FIELDS["guidance"].upstream == REQUEST_FIELDS["guidance_2"].upstream == (0, 20)
    assert REQUEST_FIELDS["fps"].low == 1                   # upstream's ge=1: 0.5 would be refused after queueing


def _arithmetic(node: ast.expr) -> float:
    """A constant upstream writes as arithmetic (`-(2**63)`), evaluated only when it holds numbers alone."""
    assert all(isinstance(n, (ast.Constant, ast.BinOp, ast.UnaryOp, ast.operator, ast.unaryop))
               for n in ast.walk(node)), ast.dump(node)
    return eval(compile(ast.Expression(node), "protocol", "eval"), {"__builtins__": {}})


def test_the_upstream_ranges_are_the_installed_protocols(server_env_python):
    """The declared upstream ranges are the installed vLLM-Omni's own request model's (its source read as a
    file: nothing of it is imported)."""
    site = Path(subprocess.run([server_env_python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    tree = ast.parse((site / UPSTREAM_PROTOCOL).read_text(encoding="utf-8"))
    names = {t.id: _arithmetic(node.value) for node in tree.body if isinstance(node, ast.Assign)
             for t in node.targets if isinstance(t, ast.Name) and t.id.startswith("_INT64_")}
    request = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "VideoGenerationRequest")
    ranges = {}
    for node in request.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.value, ast.Call):
            keywords = {k.arg: k.value for k in node.value.keywords}
            ranges[node.target.id] = tuple(
                None if keywords.get(bound) is None else
                names[keywords[bound].id] if isinstance(keywords[bound], ast.Name) else
                _arithmetic(keywords[bound]) for bound in ("ge", "le"))
    for field in REQUEST_FIELDS.values():
        assert ranges[field.form] == field.upstream, field.name


def test_the_generate_widgets_are_the_declarations_in_their_released_range():
    for node_id in ("VLLMOmniGenerateVideo", "VLLMOmniGenerateBatch"):
        inputs = _inputs(node_id)
        for name, released in RELEASED_GENERATE.items():
            field, opts = REQUEST_FIELDS[name], inputs[name].opts
            assert (opts["min"], opts["max"]) == released, (node_id, name)
            assert opts["max"] == field.high and opts["min"] == (field.low if field.marker is None else field.marker)
            assert type(opts["max"]) is field.kind and type(inputs[name].default) is field.kind


def test_the_pipeline_widgets_are_the_declarations_with_their_own_caps():
    vace, s2v = _inputs("VLLMOmniGenerateVACE"), _inputs("VLLMOmniGenerateSpeechToVideo")
    for inputs in (vace, s2v):
        for name, released in RELEASED_PIPELINE.items():
            assert (inputs[name].opts["min"], inputs[name].opts["max"]) == released, name
    assert vace["frames"].opts["max"] == media.MAX_CONTROL_FRAMES == 257
    assert s2v["frames"].opts["max"] == S2V_FRAMES_PER_CLIP_MAX == 120
    assert REQUEST_FIELDS["seed"].high == vace["seed"].opts["max"] == SEED.high


def test_the_server_refusal_fix_gives_the_declared_range():
    assert FIELD_LIMITS["num_inference_steps"] == "1..200"
    assert FIELD_LIMITS["guidance_scale"] == FIELD_LIMITS["guidance_scale_2"] == "0..20"
    assert FIELD_LIMITS["boundary_ratio"] == "0..1" and FIELD_LIMITS["fps"] == "1..120"
    assert FIELD_LIMITS["num_frames"] == "1..1025, 4k+1 for Wan (e.g. 81)"
    assert FIELD_LIMITS["seed"] == f"0..{2**63 - 1}"


# --------------------------------------------------------------------------- the core's check
@pytest.mark.parametrize("name,value,fix", [
    ("steps", 500, "set steps to 200 (0 on the node for the model's recommended value)"),
    ("guidance", 80.0, "set guidance to 20 (-1 on the node for the model's recommended value)"),
    ("guidance_2", 21.0, "set guidance_2 to 20 (-1 on the node for the model's recommended value)"),
    ("boundary_ratio", 1.5, "set boundary_ratio to 1 (-1 on the node for the model's recommended value)"),
    ("fps", 0.5, "set fps to 1 (0 on the node for the model's recommended value)"),
    ("fps", 240.0, "set fps to 120 (0 on the node for the model's recommended value)"),
    ("flow_shift", 60.0, "set flow_shift to 50 (-1 on the node for the model's recommended value)"),
    ("width", 8192, "set width to 4096 (0 on the node for the model's recommended value)"),
    ("frames", 2001, "set frames to 1025 (0 on the node for the model's recommended value)"),
    ("seed", -5, "set seed to 0"),
    ("seed", 2**63, f"set seed to {2**63 - 1}"),
])
def test_the_core_refuses_a_value_out_of_range_naming_the_setting(name, value, fix):
    with pytest.raises(LauncherError) as err:
        request_for(T2V, prompt="a fox", **{name: value})
    assert err.value.setting == name and err.value.fix == fix
    assert err.value.what == f"{name} {REQUEST_FIELDS[name].shown(value)} is out of range"


def test_the_core_says_whose_limit_a_value_breaks():
    with pytest.raises(LauncherError) as upstream:
        request_for(T2V, prompt="a fox", steps=201)
    assert upstream.value.why == "steps is the number of denoise steps and must be at most 200 (vLLM-Omni's limit)"
    with pytest.raises(LauncherError) as own:
        request_for(T2V, prompt="a fox", width=4112)
    assert own.value.why == "width is the frame width in pixels and must be at most 4096 (the launcher's limit)"


def test_the_bounds_themselves_and_the_markers_pass():
    request = request_for(T2V, prompt="a fox", steps=200, guidance=20.0, guidance_2=0.0, boundary_ratio=1.0,
                          fps=1.0, flow_shift=50.0, seed=2**63 - 1, width=4096, height=16, frames=1025)
    assert (request.steps, request.guidance, request.seed, request.width) == (200, 20.0, 2**63 - 1, 4096)
    defaults = request_for(T2V, prompt="a fox", steps=0, fps=0, guidance=-1, flow_shift=-1, width=0)
    assert (defaults.steps, defaults.fps, defaults.guidance, defaults.width) == (T2V.steps, T2V.fps, T2V.guidance,
                                                                                 T2V.width)


def test_a_value_the_model_does_not_take_is_not_range_checked():
    """flow_shift goes to plain Wan only: a VACE request drops it, so its value cannot be refused."""
    request = request_for(PIPELINE_FAMILIES["vace_14b"], prompt="a fox", flow_shift=60.0)
    assert request.flow_shift is None


# --------------------------------------------------------------------------- the command line's words
def test_the_printer_names_every_request_fields_flag():
    """A core refusal ("set steps to 200") reaches the command line as its option (cli/report.py)."""
    flags = option_flags(build_parser("generate"))
    for field in REQUEST_FIELDS.values():
        assert flags[field.name] == "--" + field.name.replace("_", "-"), field.name
    with pytest.raises(LauncherError) as err:
        request_for(T2V, prompt="a fox", guidance_2=30.0)
    assert for_command_line(err.value, flags).fix.startswith("set --guidance-2 to 20")


# --------------------------------------------------------------------------- tooltips from the families
def test_the_generate_tooltips_show_the_families_defaults():
    a14b, ti2v = FAMILIES["t2v_a14b"], FAMILIES["ti2v_5b"]
    for attr in ("width", "height", "frames", "fps", "steps", "size_multiple"):    # "A14B" speaks for both
        assert getattr(FAMILIES["i2v_a14b"], attr) == getattr(a14b, attr), attr
    inputs = _inputs("VLLMOmniGenerateVideo")
    assert f"({a14b.steps:g} A14B, {ti2v.steps:g} TI2V-5B)" in inputs["steps"].tooltip
    assert f"({a14b.fps:g} A14B, {ti2v.fps:g} TI2V-5B)" in inputs["fps"].tooltip
    assert f"multiple of {a14b.size_multiple} (A14B) or {ti2v.size_multiple} (TI2V-5B)" in inputs["width"].tooltip
    assert f"({a14b.frames}, {ti2v.frames}, ...)" in inputs["frames"].tooltip
    description = NODES["VLLMOmniGenerateVideo"].description
    for family in (a14b, ti2v):
        assert f"{family.width}x{family.height}, {family.frames} frames at {family.fps:g} fps" in description


def test_the_pipeline_tooltips_show_the_families_defaults_and_the_media_caps():
    vace, s2v = PIPELINE_FAMILIES["vace_14b"], PIPELINE_FAMILIES["s2v_14b"]
    for attr in ("frames", "steps", "size_multiple"):                         # "VACE" speaks for both sizes
        assert getattr(PIPELINE_FAMILIES["vace_1_3b"], attr) == getattr(vace, attr), attr
    vace_in, s2v_in = _inputs("VLLMOmniGenerateVACE"), _inputs("VLLMOmniGenerateSpeechToVideo")
    assert f"(VACE {vace.steps}, S2V {s2v.steps})" in vace_in["steps"].tooltip
    assert f"else {vace.frames})" in vace_in["frames"].tooltip
    assert f"1-{media.MAX_REFERENCE_IMAGES} images" in vace_in["reference_images"].tooltip
    assert f"up to {S2V_FRAMES_PER_CLIP_MAX};" in s2v_in["frames"].tooltip and f"({s2v.frames})" in \
        s2v_in["frames"].tooltip
    assert f"at most {media.MAX_AUDIO_S:g} s" in s2v_in["audio"].tooltip
    description = NODES["VLLMOmniGenerateSpeechToVideo"].description
    assert f"0 = {s2v.width}x{s2v.height}" in description and f"at {s2v.fps:g} fps" in description
    assert f"up to {media.MAX_AUDIO_S:g} s" in description
