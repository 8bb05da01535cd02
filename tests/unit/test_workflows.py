"""The shipped templates in workflows/: format, node definitions, API twins, released copies, one real run.

Runs without ComfyUI. ComfyUI shows every ``workflows/*.json`` of a pack as a template; the
front end stores widget values by *position* (``widgets_values``), so a template breaks when a
node's widgets are reordered, retyped or inserted anywhere but at the end. These tests read
the files the way the front end does (docs/upstream-facts.md, "ComfyUI workflow JSON"):

* every node type exists (ours, or a core node described in ``CORE_NODES``, whose
  description ``tests/comfyui/run_real_comfyui.py`` compares with a real ComfyUI's
  ``/object_info``);
* ``widgets_values`` map onto today's node inputs in order, with the front-end-only
  values (``control_after_generate`` after a seed, LoadImage's ``upload``) in their places,
  and every value is valid (type, range, combo option);
* each UI workflow converts to exactly its API twin ``workflows/api/<name>.api.json``;
* the frozen copies in ``released_workflows/`` still load: values only ever appended, API
  twins still carry every required input;
* each template's request obeys its model's rules and its serving config resolves to a valid
  launch spec on the GPUs its Note asks for;
* the TI2V text-to-video API twin runs end to end through a small stand-in of ComfyUI's
  executor against the stub vLLM-Omni server (the others are checked structurally).
"""
from __future__ import annotations

import copy
import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Optional

import av
import numpy as np
import psutil
import pytest

import frame_code
import stubserver

from vllm_omni_launcher.nodes import NODES
from vllm_omni_launcher.nodes.schema import Node
from vllm_omni_launcher.models import FAMILIES, check_request, family_for
from vllm_omni_launcher.nodes.batch_count import prompt_lines
from vllm_omni_launcher.nodes.batch_session import clip_plan
from vllm_omni_launcher.nodes.handles import ModelChoice, ServingChoice
from vllm_omni_launcher.planner.launch_plan import GPU_MEMORY_ENV
from vllm_omni_launcher.server.config.local_config import LocalConfig

REPO = Path(__file__).resolve().parents[2]
WORKFLOWS = REPO / "workflows"
API_DIR = WORKFLOWS / "api"
RELEASED = Path(__file__).resolve().parent / "released_workflows"

EXPECTED_TEMPLATES = {
    "wan22_ti2v_5b_text_to_video", "wan22_ti2v_5b_image_to_video", "wan22_t2v_a14b_2gpu_ulysses",
    "wan22_i2v_a14b_2gpu_cfg", "remote_server", "wan22_t2v_a14b_4step_lora", "wan22_ti2v_5b_seed_sweep",
    "wan21_vace_control_video", "wan22_s2v_speech_to_video", "fastwan_ti2v_5b_fast_text_to_video",
}
JOB_NODES = ("VLLMOmniGenerateVideo", "VLLMOmniGenerateBatch", "VLLMOmniGenerateVACE",
             "VLLMOmniGenerateSpeechToVideo")     # a template's one job node
LOAD_NODES = ("VLLMOmniLoadModel", "VLLMOmniLoadPipelineModel")    # a local template's one model loader
TEMPLATES = sorted(p.stem for p in WORKFLOWS.glob("*.json"))

# Core ComfyUI nodes the templates use, in INPUT_TYPES form (ComfyUI 0.3.64 /object_info;
# checked against a real ComfyUI by tests/comfyui/run_real_comfyui.py). "FILE" is a combo
# whose options are the files of ComfyUI's input folder (unknown here: any file name).
CORE_NODES: dict[str, dict[str, Any]] = {
    "LoadImage": {
        "display": "Load Image",
        "input": {"required": {"image": ("FILE", {"image_upload": True})}},
        "outputs": ("IMAGE", "MASK"),
    },
    "LoadVideo": {
        "display": "Load Video",
        "input": {"required": {"file": ("FILE", {"video_upload": True})}},
        "outputs": ("VIDEO",),
        "api_extra": {"video-preview": ""},     # its preview widget: sent in the prompt, not in widgets_values
    },
    "GetVideoComponents": {
        "display": "Get Video Components",
        "input": {"required": {"video": ("VIDEO", {})}},
        "outputs": ("IMAGE", "AUDIO", "FLOAT"),
        "output_names": ("images", "audio", "fps"),       # a V3 core node names its outputs
    },
    "ImageFromBatch": {
        "display": "ImageFromBatch",
        "input": {"required": {"image": ("IMAGE", {}), "batch_index": ("INT", {"default": 0, "min": 0, "max": 4095}),
                               "length": ("INT", {"default": 1, "min": 1, "max": 4096})}},
        "outputs": ("IMAGE",),
    },
    "ImageScale": {
        "display": "Upscale Image",
        "input": {"required": {"image": ("IMAGE", {}),
                               "upscale_method": (["nearest-exact", "bilinear", "area", "bicubic", "lanczos"], {}),
                               "width": ("INT", {"default": 512, "min": 0, "max": 16384}),
                               "height": ("INT", {"default": 512, "min": 0, "max": 16384}),
                               "crop": (["disabled", "center"], {})}},
        "outputs": ("IMAGE",),
    },
    "LoadAudio": {
        "display": "Load Audio",
        "input": {"required": {"audio": ("FILE", {"audio_upload": True})}},
        "outputs": ("AUDIO",),
    },
    "SaveVideo": {
        "display": "Save Video",
        "input": {"required": {
            "video": ("VIDEO", {}),
            "filename_prefix": ("STRING", {"default": "video/ComfyUI"}),
            "format": (["auto", "mp4"], {"default": "auto"}),
            "codec": (["auto", "h264"], {"default": "auto"}),
        }},
        "outputs": (),
    },
}
# Front-end-only nodes: saved in the UI workflow, never sent to the server (absent from API twins).
VIRTUAL_NODES: dict[str, tuple[str, ...]] = {"Note": ("text",), "MarkdownNote": ("text",)}
WIDGET_TYPES = ("INT", "FLOAT", "STRING", "BOOLEAN", "COMBO", "FILE")
SEED_CONTROL_VALUES = ("fixed", "increment", "decrement", "randomize")


# --------------------------------------------------------------------------- node definitions
@dataclass(frozen=True)
class Widget:
    name: str
    spec: tuple            # (type or options, options dict); ("UI", allowed values) for front-end-only widgets
    ui_only: bool = False  # control_after_generate, upload: in widgets_values, not in the API prompt


@dataclass
class NodeDef:
    type: str
    display: str
    inputs: list[tuple[str, tuple, str]]        # (name, spec, "required" | "optional"), in input order
    outputs: tuple[str, ...]
    cls: Optional[Node] = None                  # our node's declaration (None: a core node)
    widgets: list[Widget] = field(default_factory=list)

    def input_spec(self, name: str) -> Optional[tuple]:
        return next((spec for n, spec, _ in self.inputs if n == name), None)


def _norm(spec: Any) -> tuple:
    """An INPUT_TYPES entry as (type or combo options, options dict)."""
    if isinstance(spec, str):
        return (spec, {})
    return (spec[0], dict(spec[1]) if len(spec) > 1 and spec[1] else {})


def _is_widget(spec: tuple) -> bool:
    kind, opts = spec
    return (isinstance(kind, list) or kind in WIDGET_TYPES) and not opts.get("forceInput")


def _make_def(node_type: str, display: str, input_types: dict, outputs: tuple, cls: Optional[Node]) -> NodeDef:
    inputs = [(name, _norm(spec), section) for section in ("required", "optional")
              for name, spec in (input_types.get(section) or {}).items()]
    widgets: list[Widget] = []
    for name, spec, _ in inputs:
        if not _is_widget(spec):
            continue
        widgets.append(Widget(name, spec))
        kind, opts = spec
        # The front end adds a control widget after an INT that asks for it (and, by legacy
        # convention, after any INT named seed/noise_seed), and an upload button after image combos.
        if kind == "INT" and (opts.get("control_after_generate") or name in ("seed", "noise_seed")):
            widgets.append(Widget("control_after_generate", ("UI", SEED_CONTROL_VALUES), ui_only=True))
        if opts.get("image_upload") or opts.get("video_upload"):   # the front end names both "image"
            widgets.append(Widget("upload", ("UI", ("image",)), ui_only=True))
        if opts.get("audio_upload"):     # an upload button, then the player, which graphToPrompt sends too
            widgets += [Widget("upload", ("UI", (None,)), ui_only=True), Widget("audioUI", ("UI", ("",)))]
    return NodeDef(node_type, display, inputs, tuple(outputs), cls, widgets)


# Our combos whose options are files of the user's machine (unknown here: any file name, like FILE).
MACHINE_LISTS = {("VLLMOmniLora", "lora_name")}


def _machine_lists(node_type: str, input_types: dict) -> dict:
    for section in input_types.values():
        for name in section:
            if (node_type, name) in MACHINE_LISTS:
                section[name] = ("FILE", section[name][1])
    return input_types


def v1_inputs(node: Node) -> dict:
    """Our node's inputs as ComfyUI's /object_info gives a V3 node's (io.Schema.get_v1_info: a combo is
    ("COMBO", {"options": [...]})); tests/comfyui/run_real_comfyui.py compares them with a real ComfyUI."""
    out: dict[str, dict] = {}
    for spec in node.inputs():
        opts = {"tooltip": spec.tooltip, **spec.opts, **({} if spec.default is None else {"default": spec.default})}
        if spec.kind == "COMBO":
            opts["options"] = spec.choices()
        out.setdefault("optional" if spec.optional else "required", {})[spec.name] = (spec.kind, opts)
    return out


def node_defs() -> dict[str, NodeDef]:
    defs = {node_type: _make_def(node_type, node.display_name, _machine_lists(node_type, v1_inputs(node)),
                                 tuple(o.kind for o in node.outputs), node)
            for node_type, node in NODES.items()}
    for node_type, core in CORE_NODES.items():
        defs[node_type] = _make_def(node_type, core["display"], core["input"], core["outputs"], None)
    return defs


def value_problem(spec: tuple, value: Any) -> Optional[str]:
    """Why `value` is not a valid value for a widget of this spec (None when it is)."""
    kind, opts = spec
    if kind == "UI":
        return None if value in opts else f"{value!r} not one of {list(opts)}"
    if isinstance(kind, list) or kind == "COMBO":
        options = kind if isinstance(kind, list) else opts.get("options", [])
        return None if value in options else f"{value!r} not one of {options}"
    if kind == "FILE":
        return None if isinstance(value, str) and value and "/" not in value and "\\" not in value \
            else f"{value!r} is not a file name"
    if kind == "BOOLEAN":
        return None if isinstance(value, bool) else f"{value!r} is not a boolean"
    if kind == "STRING":
        return None if isinstance(value, str) else f"{value!r} is not a string"
    if kind in ("INT", "FLOAT"):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return f"{value!r} is not a number"
        if kind == "INT" and not float(value).is_integer():
            return f"{value!r} is not an integer"
        if "min" in opts and value < opts["min"]:
            return f"{value!r} < min {opts['min']}"
        if "max" in opts and value > opts["max"]:
            return f"{value!r} > max {opts['max']}"
        return None
    return f"{kind} is not a widget type"


def widget_problems(nd: NodeDef, values: list, *, exact: bool) -> list[str]:
    """Positional check of a node's widgets_values against today's widgets.

    exact: the count must match (a shipped template); otherwise fewer values are fine
    (a released workflow saved before widgets were appended at the end).
    """
    problems = []
    if len(values) > len(nd.widgets) or (exact and len(values) != len(nd.widgets)):
        problems.append(f"{nd.type}: {len(values)} widget values for {len(nd.widgets)} widgets "
                        f"{[w.name for w in nd.widgets]}")
    for widget, value in zip(nd.widgets, values):
        why = value_problem(widget.spec, value)
        if why:
            problems.append(f"{nd.type}.{widget.name}: {why}")
    return problems


def api_input_problems(nd: NodeDef, inputs: dict) -> list[str]:
    problems = []
    for name, spec, section in nd.inputs:
        if name not in inputs:
            if section == "required":
                problems.append(f"{nd.type}: required input {name} is missing")
            continue
        value = inputs[name]
        if isinstance(value, list):            # a link [node id, output slot]
            if not (len(value) == 2 and isinstance(value[0], str) and isinstance(value[1], int)):
                problems.append(f"{nd.type}.{name}: bad link {value!r}")
        elif not _is_widget(spec):
            problems.append(f"{nd.type}.{name}: {spec[0]} input has a value instead of a link")
        else:
            why = value_problem(spec, value)
            if why:
                problems.append(f"{nd.type}.{name}: {why}")
    for name in inputs:
        if nd.input_spec(name) is None and not any(w.name == name and w.spec[0] == "UI" for w in nd.widgets) \
                and name not in CORE_NODES.get(nd.type, {}).get("api_extra", {}):
            problems.append(f"{nd.type}: unknown input {name}")
    return problems


# --------------------------------------------------------------------------- workflow files
def load(path: Path) -> dict:
    return json.loads(path.read_text())


def ui_path(name: str) -> Path:
    return WORKFLOWS / f"{name}.json"


def api_path(name: str) -> Path:
    return API_DIR / f"{name}.api.json"


def links_by_id(ui: dict) -> dict[int, list]:
    return {link[0]: link for link in ui["links"]}


def ui_to_api(ui: dict, defs: dict[str, NodeDef]) -> dict:
    """What the front end's graphToPrompt() makes of a UI workflow (no virtual nodes, widgets by name)."""
    links = links_by_id(ui)
    prompt = {}
    for node in ui["nodes"]:
        if node["type"] in VIRTUAL_NODES or node.get("mode", 0) in (2, 4):   # muted / bypassed
            continue
        nd = defs[node["type"]]
        inputs: dict[str, Any] = {}
        for widget, value in zip(nd.widgets, node.get("widgets_values") or []):
            if not widget.ui_only:
                inputs[widget.name] = value
        inputs.update(CORE_NODES.get(node["type"], {}).get("api_extra", {}))
        for slot in node.get("inputs") or []:
            if slot.get("link") is not None:
                link = links[slot["link"]]
                inputs[slot["name"]] = [str(link[1]), link[2]]
        prompt[str(node["id"])] = {"inputs": inputs, "class_type": node["type"],
                                   "_meta": {"title": node.get("title") or nd.display}}
    return prompt


def strings_in(obj: Any) -> list[str]:
    if isinstance(obj, str):
        return [obj]
    if isinstance(obj, dict):
        return [s for v in obj.values() for s in strings_in(v)] + [k for k in obj if isinstance(k, str)]
    if isinstance(obj, list):
        return [s for v in obj for s in strings_in(v)]
    return []


def nodes_of(ui: dict, node_type: str) -> list[dict]:
    return [n for n in ui["nodes"] if n["type"] == node_type]


def widgets_by_name(nd: NodeDef, node: dict) -> dict[str, Any]:
    return {w.name: v for w, v in zip(nd.widgets, node.get("widgets_values") or [])}


@pytest.fixture(scope="module")
def defs() -> dict[str, NodeDef]:
    return node_defs()


# --------------------------------------------------------------------------- the shipped set
def test_the_shipped_templates_are_the_documented_ones_each_with_an_api_twin():
    assert set(TEMPLATES) == EXPECTED_TEMPLATES
    assert {p.name for p in API_DIR.glob("*.json")} == {f"{n}.api.json" for n in EXPECTED_TEMPLATES}


def test_no_api_format_file_sits_where_comfyui_lists_templates():
    # ComfyUI lists every workflows/*.json in the template browser; an API prompt is not a graph.
    for name in TEMPLATES:
        data = load(ui_path(name))
        assert "nodes" in data and "links" in data, f"{name}.json is not a UI workflow"
        assert "class_type" not in json.dumps(data), f"{name}.json looks like an API prompt"


@pytest.mark.parametrize("name", TEMPLATES)
def test_ui_workflow_is_frontend_format_0_4_with_consistent_links(name):
    ui = load(ui_path(name))
    assert ui["version"] == 0.4
    for key in ("last_node_id", "last_link_id", "nodes", "links", "groups", "config", "extra"):
        assert key in ui, key
    ids = [n["id"] for n in ui["nodes"]]
    assert len(ids) == len(set(ids)), "duplicate node ids"
    assert ui["last_node_id"] >= max(ids)
    nodes = {n["id"]: n for n in ui["nodes"]}
    links = links_by_id(ui)
    assert len(links) == len(ui["links"]), "duplicate link ids"
    assert not links or ui["last_link_id"] >= max(links)
    for link_id, (lid, src, src_slot, dst, dst_slot, kind) in links.items():
        assert src in nodes and dst in nodes, f"link {lid} joins missing nodes"
        out = nodes[src]["outputs"][src_slot]
        inp = nodes[dst]["inputs"][dst_slot]
        assert link_id in (out.get("links") or []), f"link {lid} not listed on its output"
        assert inp.get("link") == link_id, f"link {lid} not set on its input"
        assert out["type"] == inp["type"] == kind, f"link {lid}: {out['type']} -> {inp['type']} as {kind}"
    for node in ui["nodes"]:   # and no slot points at a link that does not exist
        for inp in node.get("inputs") or []:
            assert inp.get("link") is None or inp["link"] in links
        for out in node.get("outputs") or []:
            assert all(lid in links for lid in out.get("links") or [])


@pytest.mark.parametrize("name", TEMPLATES)
def test_every_node_type_is_ours_or_a_known_core_node(name, defs):
    for node in load(ui_path(name))["nodes"]:
        assert node["type"] in defs or node["type"] in VIRTUAL_NODES, node["type"]
    for entry in load(api_path(name)).values():
        assert entry["class_type"] in defs, entry["class_type"]


@pytest.mark.parametrize("name", TEMPLATES)
def test_widget_values_match_todays_input_types_in_order(name, defs):
    problems = []
    for node in load(ui_path(name))["nodes"]:
        if node["type"] in VIRTUAL_NODES:
            values = node.get("widgets_values") or []
            if len(values) != len(VIRTUAL_NODES[node["type"]]) or not all(isinstance(v, str) for v in values):
                problems.append(f"{node['type']}: {values!r}")
            continue
        problems += widget_problems(defs[node["type"]], node.get("widgets_values") or [], exact=True)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("name", TEMPLATES)
def test_links_join_outputs_and_inputs_of_the_declared_types(name, defs):
    ui = load(ui_path(name))
    nodes = {n["id"]: n for n in ui["nodes"]}
    for _, src, src_slot, dst, dst_slot, kind in ui["links"]:
        out_def, in_def = defs[nodes[src]["type"]], defs[nodes[dst]["type"]]
        assert out_def.outputs[src_slot] == kind, f"{out_def.type} output {src_slot} is {out_def.outputs[src_slot]}"
        assert nodes[src]["outputs"][src_slot]["name"] in (
            [o.name for o in out_def.cls.outputs] if out_def.cls else
            CORE_NODES[out_def.type].get("output_names", out_def.outputs))
        in_name = nodes[dst]["inputs"][dst_slot]["name"]
        spec = in_def.input_spec(in_name)
        assert spec is not None, f"{in_def.type} has no input {in_name}"
        assert spec[0] == kind, f"{in_def.type}.{in_name} takes {spec[0]}, linked {kind}"


@pytest.mark.parametrize("name", TEMPLATES)
def test_api_twin_is_exactly_the_ui_workflow_converted(name, defs):
    assert load(api_path(name)) == ui_to_api(load(ui_path(name)), defs)


@pytest.mark.parametrize("name", TEMPLATES)
def test_api_twin_has_every_required_input_with_a_valid_value(name, defs):
    problems = []
    for node_id, entry in load(api_path(name)).items():
        problems += api_input_problems(defs[entry["class_type"]], entry["inputs"])
        for value in entry["inputs"].values():
            if isinstance(value, list):
                assert value[0] in load(api_path(name)), f"{node_id} links to missing node {value[0]}"
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("name", TEMPLATES)
def test_each_template_ends_in_save_video_fed_by_generate_video(name):
    api = load(api_path(name))
    saves = [e for e in api.values() if e["class_type"] == "SaveVideo"]
    assert len(saves) == 1
    src = api[saves[0]["inputs"]["video"][0]]
    assert src["class_type"] in JOB_NODES and saves[0]["inputs"]["video"][1] == 2  # VIDEO output


@pytest.mark.parametrize("name", TEMPLATES)
def test_each_template_has_a_note_saying_what_it_needs(name):
    notes = nodes_of(load(ui_path(name)), "Note")
    assert len(notes) == 1
    text = notes[0]["widgets_values"][0]
    assert "GPU" in text
    if name != "remote_server":
        assert re.search(r"\d+ GB or more", text), "GPU memory"
        assert re.search(r"download.*about \d+ GB", text, re.S), "model download size"
    else:
        assert "API key" in text and "never in the workflow" in text


@pytest.mark.parametrize("name", TEMPLATES)
def test_no_absolute_paths_secrets_or_device_names(name):
    for path in (ui_path(name), api_path(name)):
        for text in strings_in(load(path)):
            assert not re.search(r"(^|[\s'\"=])(/(home|root|tmp|usr|opt|mnt|data|work)/|~/|[A-Za-z]:\\)", text), text
            assert not re.search(r"cuda:\d|CUDA_VISIBLE_DEVICES|\bH[12]00\b|\bA100\b|RTX|GeForce", text), text
            assert not re.search(r"\b(sk-[A-Za-z0-9]{8,}|hf_[A-Za-z0-9]{8,})|api_key\s*[:=]|Bearer ", text), text


def test_number_widgets_can_be_set_to_the_values_the_wan_rules_ask_for(defs):
    # ComfyUI's front end (1.27) snaps an edited INT widget to min + k*step: a step of 4 on
    # frames (min 0) made 81 impossible to type. Every valid Wan2.2 value must be on the grid.
    gen = defs["VLLMOmniGenerateVideo"]
    wanted = {"frames": [5, 81, 121], "width": [832, 1280, 480, 704], "height": [480, 704, 832, 1280],
              "steps": [4, 40, 50]}
    for name, values in wanted.items():
        _, opts = gen.input_spec(name)
        step, low = opts.get("step", 1), opts.get("min", 0)
        for value in values:
            assert (value - low) % step == 0 and low <= value <= opts["max"], (name, value, opts)


# --------------------------------------------------------------------------- template semantics
def _generate_request(name: str, defs: dict[str, NodeDef]) -> tuple[Any, dict, bool]:
    ui = load(ui_path(name))
    (gen,) = [n for n in ui["nodes"] if n["type"] in JOB_NODES]
    values = widgets_by_name(defs[gen["type"]], gen)
    has_image = any(i["name"] == "image" and i.get("link") is not None for i in gen["inputs"])
    loaders = [n for kind in LOAD_NODES for n in nodes_of(ui, kind)]
    if loaders:
        family = family_for(loaders[0]["widgets_values"][0])
    else:
        family = FAMILIES[nodes_of(ui, "VLLMOmniRemoteServer")[0]["widgets_values"][1]]
    return family, values, has_image


@pytest.mark.parametrize("name", TEMPLATES)
def test_template_request_obeys_its_model_rules(name, defs):
    family, values, has_image = _generate_request(name, defs)
    assert values.get("prompt", values.get("prompts")).strip()
    check_request(family, width=values["width"] or family.width, height=values["height"] or family.height,
                  frames=values["frames"] or family.frames, has_image=has_image)
    expected_image = {"wan22_ti2v_5b_image_to_video": True, "wan22_i2v_a14b_2gpu_cfg": True,
                      "wan22_s2v_speech_to_video": True}.get(name, False)
    assert has_image == expected_image


LOCAL_TEMPLATES = {   # template -> (GPU memory its Note asks for, expected parallel layout)
    "wan22_ti2v_5b_text_to_video": ("16", None),
    "wan22_ti2v_5b_image_to_video": ("16", None),
    "wan22_ti2v_5b_seed_sweep": ("16", None),
    "wan22_t2v_a14b_2gpu_ulysses": ("80,80", ("ulysses", 2, 2, (0, 1))),
    "wan22_i2v_a14b_2gpu_cfg": ("80,80", ("cfg", 2, 2, (0, 1))),
    "wan22_t2v_a14b_4step_lora": ("80,80", ("ulysses", 2, 2, (0, 1))),
    "wan21_vace_control_video": ("24", None),
    "wan22_s2v_speech_to_video": ("80", None),
    "fastwan_ti2v_5b_fast_text_to_video": ("40", None),
}


@pytest.fixture
def stub_config(server_env_python: str) -> LocalConfig:
    """The launcher checks the server environment's vllm / vllm-omni pair: use the stub's (0.30).
    Without the server environment the test is skipped, saying so."""
    return LocalConfig(server_command=(server_env_python, stubserver.STUB_SCRIPT))


def _template_choices(name: str, defs: dict[str, NodeDef]) -> tuple[Any, Any]:
    """What the template's Load Model and Serving Config nodes output."""
    ui = load(ui_path(name))
    (loader,) = [n for kind in LOAD_NODES for n in nodes_of(ui, kind)]
    model = defs[loader["type"]].cls.call({"model": loader["widgets_values"][0]})[0]
    serving_values = widgets_by_name(defs["VLLMOmniServingConfig"], nodes_of(ui, "VLLMOmniServingConfig")[0])
    return model, defs["VLLMOmniServingConfig"].cls.call(serving_values)[0]


def _note(name: str) -> str:
    return nodes_of(load(ui_path(name)), "Note")[0]["widgets_values"][0]


@pytest.mark.parametrize("name", sorted(LOCAL_TEMPLATES))
def test_template_serving_config_resolves_to_a_valid_launch_spec(name, defs, stub_config, monkeypatch):
    memory, layout = LOCAL_TEMPLATES[name]
    monkeypatch.setenv(GPU_MEMORY_ENV, memory)
    # a machine with 64 GB of free system RAM (what the TI2V Notes assume), not this busy box's
    monkeypatch.setattr(psutil, "virtual_memory", lambda: SimpleNamespace(available=64 * 2**30))
    model, serving = _template_choices(name, defs)
    assert isinstance(model, ModelChoice) and isinstance(serving, ServingChoice)
    plan = serving.resolve(model.model, stub_config)
    spec = plan.spec
    assert spec.validate(visible_gpus=len(memory.split(","))) == []      # no warnings either
    assert plan.fallback is not None, "auto_fallback is on in every template"
    if layout is None:       # 'auto' on one 16 GB GPU: the planner chose, and said so
        assert serving.parallel_mode == "auto" and plan.text.startswith("Recommended: ")
        assert spec.parallel.world_size <= 1
    else:
        mode, degree, vae_patch, gpus = layout
        assert (spec.parallel.mode, spec.parallel.degree, spec.parallel.vae_patch, spec.gpus) == \
            (mode, degree, vae_patch, gpus)


# The TI2V templates serve with 'auto': what the planner picks for their defaults (Generate's widgets
# are all 0) on the machines their Note describes, and the Note's words for each.
TI2V_NOTES = ["wan22_ti2v_5b_text_to_video", "wan22_ti2v_5b_image_to_video", "wan22_ti2v_5b_seed_sweep"]
TI2V_PLANS = [   # ((GPU GiB, free system RAM GiB), planner's choice, frames it reduces the default to, Note)
    ((80, 64), "1 GPU, no offload", None, "on 40 GB or more no offload;"),
    ((40, 64), "1 GPU, no offload", None, "on 40 GB or more no offload;"),
    ((24, 64), "1 GPU + layerwise offload", None, "on a 24 GB card layerwise offload;"),
    ((16, 64), "1 GPU + layerwise offload + VAE tiling", None,
     "on 16 GB layerwise offload + VAE tiling, still at the full 121 frames;"),
    ((8, 64), "1 GPU + layerwise offload + VAE tiling", 33,
     "on smaller cards it lowers the frame count (33 frames on 8 GB)"),
]


@pytest.mark.parametrize("name", TI2V_NOTES)
@pytest.mark.parametrize("machine,label,frames,words", TI2V_PLANS)
def test_ti2v_note_says_what_the_planner_picks_for_the_template_defaults(name, machine, label, frames, words, defs):
    from vllm_omni_launcher.planner.ladder import recommend
    from vllm_omni_launcher.server.launch.spec import LaunchSpec

    note = _note(name)
    assert words in note and "With vLLM-Omni 0.30 (what setup installs)" in note
    model, serving = _template_choices(name, defs)
    assert serving.parallel_mode == "auto" and serving.gpus == "auto"
    gpu, ram = machine
    rec = recommend(LaunchSpec(model=model.model), gpus=[gpu], host_available_gib=ram, server_version=(0, 30))
    assert rec.label == label
    assert (rec.request.frames if rec.reduced else None) == frames
    assert rec.asked.label() == "1280x704x121" and "1280x704, 121 frames" in note


@pytest.mark.parametrize("name", TI2V_NOTES)
def test_ti2v_note_names_the_free_system_ram_layerwise_offload_needs(name, defs):
    """With the RAM the Note names, a 24 GB card still gets layerwise offload; with 1 GB less it does not
    (layerwise keeps the DiT and, on 0.30, the text encoder's blocks in pinned host RAM)."""
    from vllm_omni_launcher.planner.ladder import recommend
    from vllm_omni_launcher.server.launch.spec import LaunchSpec

    need = re.search(r"Layerwise offload needs about (\d+) GB of free system RAM", _note(name))
    assert need, _note(name)
    model, _ = _template_choices(name, defs)
    enough, short = (recommend(LaunchSpec(model=model.model), gpus=[24], host_available_gib=float(ram),
                               server_version=(0, 30)) for ram in (int(need[1]), int(need[1]) - 1))
    assert enough.label == "1 GPU + layerwise offload" and not enough.reduced
    assert short.spec is None or short.spec.memory.offload != "layerwise"


@pytest.mark.parametrize("name", ["wan22_t2v_a14b_2gpu_ulysses", "wan22_i2v_a14b_2gpu_cfg",
                                  "wan22_t2v_a14b_4step_lora"])
def test_a14b_note_states_the_planned_peak_of_its_serving_config(name, defs, stub_config, monkeypatch):
    from vllm_omni_launcher.planner.memory import plan as memory_plan

    monkeypatch.setenv(GPU_MEMORY_ENV, "80,80")
    model, serving = _template_choices(name, defs)
    spec = serving.resolve(model.model, stub_config).spec
    estimate = memory_plan(spec, None, [80, 80], host_available_gib=None)
    note = _note(name)
    peak = re.search(r"planned peak about (\d+) GiB per GPU", note, re.I)
    assert peak and "80 GB or more each" in note and estimate.fits
    assert abs(estimate.peak_gib - int(peak[1])) <= 1.0, (estimate.peak_gib, peak[0])


def test_a_plan_that_reduces_the_default_request_says_generate_applies_it(defs, stub_config, monkeypatch):
    from vllm_omni_launcher.planner import ladder

    real = ladder.recommend
    monkeypatch.setattr("vllm_omni_launcher.planner.launch_plan.recommend",
                        lambda base, **kw: real(base, host_available_gib=64, **kw))
    monkeypatch.setenv(GPU_MEMORY_ENV, "8")                                                    # a small card
    model, serving = _template_choices("wan22_ti2v_5b_text_to_video", defs)
    plan = serving.resolve(model.model, stub_config)
    assert (plan.limit.width, plan.limit.height, plan.limit.frames) == (1280, 704, 33)
    assert "request reduced: 1280x704x121 -> 1280x704x33" in plan.text
    assert "Generate Video uses 1280x704x33 where its width, height and frames are 0" in plan.text
    assert not re.search(r"not [^\n]*: *$", plan.text, re.M), "a rejected configuration without a reason"


# --------------------------------------------------------------------------- released copies
RELEASED_UI = sorted(p.name for p in RELEASED.glob("*.json") if not p.name.endswith(".api.json"))
RELEASED_API = sorted(p.name for p in RELEASED.glob("*.api.json"))


def test_every_shipped_template_has_a_frozen_released_copy():
    # At each release, `python tests/comfyui/make_workflows.py --freeze` copies the templates here.
    assert {f"{n}.json" for n in TEMPLATES} <= set(RELEASED_UI)
    assert {f"{n}.api.json" for n in TEMPLATES} <= set(RELEASED_API)


@pytest.mark.parametrize("filename", RELEASED_UI)
def test_released_ui_workflow_still_loads_with_todays_nodes(filename, defs):
    ui = load(RELEASED / filename)
    problems = []
    nodes = {n["id"]: n for n in ui["nodes"]}
    for node in ui["nodes"]:
        if node["type"] in VIRTUAL_NODES:
            continue
        if node["type"] not in defs:
            problems.append(f"node type {node['type']} is gone")
            continue
        problems += widget_problems(defs[node["type"]], node.get("widgets_values") or [], exact=False)
    for _, src, src_slot, dst, dst_slot, kind in ui["links"]:
        out_def, in_def = defs[nodes[src]["type"]], defs[nodes[dst]["type"]]
        if src_slot >= len(out_def.outputs) or out_def.outputs[src_slot] != kind:
            problems.append(f"{out_def.type} output {src_slot} is no longer {kind}")
        spec = in_def.input_spec(nodes[dst]["inputs"][dst_slot]["name"])
        if spec is None or spec[0] != kind:
            problems.append(f"{in_def.type} input {nodes[dst]['inputs'][dst_slot]['name']} no longer takes {kind}")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("filename", RELEASED_API)
def test_released_api_workflow_still_validates_with_todays_nodes(filename, defs):
    problems = []
    for entry in load(RELEASED / filename).values():
        if entry["class_type"] not in defs:
            problems.append(f"node type {entry['class_type']} is gone")
            continue
        # a new *required* input breaks every saved API prompt: new inputs must be optional
        problems += api_input_problems(defs[entry["class_type"]], entry["inputs"])
    assert not problems, "\n".join(problems)


def test_the_positional_check_rejects_reordered_inserted_and_retyped_widgets(defs):
    node = nodes_of(load(ui_path("wan22_t2v_a14b_2gpu_ulysses")), "VLLMOmniServingConfig")[0]
    nd = defs["VLLMOmniServingConfig"]
    values = node["widgets_values"]
    assert widget_problems(nd, values, exact=True) == []
    swapped = values[:1] + [values[2], values[1]] + values[3:]             # parallel_mode <-> parallel_degree
    assert widget_problems(nd, swapped, exact=False)
    inserted = copy.deepcopy(nd)
    inserted.widgets.insert(1, Widget("new_flag", ("BOOLEAN", {})))     # a widget added in the middle
    assert widget_problems(inserted, values, exact=False)
    gen = defs["VLLMOmniGenerateVideo"]
    gen_values = nodes_of(load(ui_path("wan22_t2v_a14b_2gpu_ulysses")), "VLLMOmniGenerateVideo")[0]["widgets_values"]
    assert widget_problems(gen, gen_values[:-1] + ["sometimes"], exact=True)  # bad control_after_generate
    assert widget_problems(gen, gen_values[:-2], exact=True)                  # seed control missing


# --------------------------------------------------------------------------- one real run
class StandInExecutor:
    """The part of ComfyUI's executor an API prompt needs: validate, order, call, collect UI outputs.

    Our nodes run for real; core LoadImage and SaveVideo are small stand-ins with the same
    inputs and outputs (ComfyUI itself is not installed in CI).
    """

    def __init__(self, defs: dict[str, NodeDef], input_dir: Path, output_dir: Path) -> None:
        self.defs, self.input_dir, self.output_dir = defs, input_dir, output_dir
        self.outputs: dict[str, tuple] = {}
        self.ui: dict[str, dict] = {}
        self.order: list[str] = []

    def validate(self, prompt: dict) -> None:
        problems = []
        for node_id, entry in prompt.items():
            nd = self.defs[entry["class_type"]]
            problems += [f"{node_id}: {p}" for p in api_input_problems(nd, entry["inputs"])]
            for name, value in entry["inputs"].items():
                if isinstance(value, list):
                    src = self.defs[prompt[value[0]]["class_type"]]
                    if src.outputs[value[1]] != nd.input_spec(name)[0]:
                        problems.append(f"{node_id}.{name}: {src.outputs[value[1]]} linked to {nd.input_spec(name)[0]}")
            if nd.cls is not None:            # V3 validate_inputs: our literal combo values
                result = nd.cls.validate({k: v for k, v in entry["inputs"].items() if not isinstance(v, list)})
                if result is not True:
                    problems.append(f"{node_id}: {result}")
        assert not problems, "prompt validation failed:\n" + "\n".join(problems)

    def topological(self, prompt: dict) -> list[str]:
        order, done = [], set()

        def visit(node_id: str, path: tuple) -> None:
            assert node_id not in path, f"cycle through {node_id}"
            if node_id in done:
                return
            for value in prompt[node_id]["inputs"].values():
                if isinstance(value, list):
                    visit(value[0], path + (node_id,))
            done.add(node_id)
            order.append(node_id)

        for node_id in sorted(prompt, key=int):
            visit(node_id, ())
        return order

    def run(self, prompt: dict) -> None:
        self.validate(prompt)
        self.order = self.topological(prompt)
        for node_id in self.order:
            entry = prompt[node_id]
            kwargs = {k: (self.outputs[v[0]][v[1]] if isinstance(v, list) else v) for k, v in entry["inputs"].items()}
            nd = self.defs[entry["class_type"]]
            if nd.cls is None:
                result = getattr(self, "core_" + entry["class_type"])(**kwargs)
            else:
                result = nd.cls.call(kwargs, {"unique_id": node_id})      # what V3 execute does
            if isinstance(result, dict):
                self.ui[node_id] = result.get("ui", {})
                result = tuple(result.get("result", ()))
            assert isinstance(result, tuple) and len(result) == len(nd.outputs), (node_id, result)
            self.outputs[node_id] = result

    def core_LoadImage(self, image: str) -> dict:  # noqa: N802
        import torch
        from PIL import Image

        with Image.open(self.input_dir / image) as im:
            array = np.asarray(im.convert("RGB"), dtype=np.float32) / 255.0
        tensor = torch.from_numpy(array)[None]
        return {"result": (tensor, torch.zeros(tensor.shape[:3]))}

    def core_SaveVideo(self, video: Any, filename_prefix: str, format: str, codec: str) -> dict:  # noqa: A002, N802
        subfolder, _, prefix = filename_prefix.rpartition("/")
        folder = self.output_dir / subfolder
        folder.mkdir(parents=True, exist_ok=True)
        filename = f"{prefix}_00001_.mp4"
        video.save_to(str(folder / filename), format=format, codec=codec)
        return {"ui": {"images": [{"filename": filename, "subfolder": subfolder, "type": "output"}],
                       "animated": [True]}, "result": ()}


TINY = {"width": 64, "height": 64, "frames": 5, "steps": 2}   # TI2V-5B: sizes x32, frames 4k+1


def test_ti2v_text_to_video_template_runs_end_to_end_on_the_stub_server(defs, server_env_python, tmp_path,
                                                                         monkeypatch):
    from vllm_omni_launcher.server import registry

    monkeypatch.setenv("VLLM_OMNI_LAUNCHER_SERVER_CMD", shlex.join([server_env_python, stubserver.STUB_SCRIPT]))
    monkeypatch.setenv(GPU_MEMORY_ENV, "24")        # the GPU the template's Note asks for
    monkeypatch.setenv("VLLM_OMNI_STUB_STEP_S", "0.02")
    prompt = load(api_path("wan22_ti2v_5b_text_to_video"))
    gen_id = next(k for k, e in prompt.items() if e["class_type"] == "VLLMOmniGenerateVideo")
    prompt[gen_id]["inputs"].update(TINY)
    seed = prompt[gen_id]["inputs"]["seed"]
    executor = StandInExecutor(defs, tmp_path / "input", tmp_path / "output")
    try:
        executor.run(prompt)
        server_id = next(k for k, e in prompt.items() if e["class_type"] == "VLLMOmniLocalServer")
        handle = executor.outputs[server_id][0]
        assert handle.kind == "local" and handle.family_key == "ti2v_5b"
    finally:
        registry.stop_all()
    assert [prompt[i]["class_type"] for i in executor.order] == [
        "VLLMOmniLoadModel", "VLLMOmniServingConfig", "VLLMOmniLocalServer", "VLLMOmniGenerateVideo", "SaveVideo"]
    frames, fps, _ = executor.outputs[gen_id]
    assert tuple(frames.shape) == (5, 64, 64, 3) and str(frames.dtype) == "torch.float32"
    assert fps == FAMILIES["ti2v_5b"].fps                    # fps 0 in the template: the model's 24
    save_id = next(k for k, e in prompt.items() if e["class_type"] == "SaveVideo")
    saved = executor.ui[save_id]["images"][0]
    path = tmp_path / "output" / saved["subfolder"] / saved["filename"]
    assert saved["subfolder"] == "video" and path.stat().st_size > 0
    with av.open(str(path)) as container:
        decoded = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    assert len(decoded) == 5 and decoded[0].shape == (64, 64, 3)
    # the stub paints frame index and seed into each frame: this file is our request's output
    assert [frame_code.decode(f.astype(np.float32) / 255.0) for f in decoded] == [(i, seed % 256) for i in range(5)]


def test_stand_in_executor_refuses_an_invalid_prompt_like_comfyui(defs, tmp_path):
    prompt = load(api_path("wan22_ti2v_5b_text_to_video"))
    gen_id = next(k for k, e in prompt.items() if e["class_type"] == "VLLMOmniGenerateVideo")
    prompt[gen_id]["inputs"]["steps"] = 999                  # over the widget's max
    del prompt[gen_id]["inputs"]["prompt"]
    with pytest.raises(AssertionError, match=r"steps: 999 > max 200(.|\n)*required input prompt is missing"):
        StandInExecutor(defs, tmp_path, tmp_path).validate(prompt)


def test_image_templates_reference_comfyuis_shipped_example_image(defs):
    for name in ("wan22_ti2v_5b_image_to_video", "wan22_i2v_a14b_2gpu_cfg"):
        load_image = nodes_of(load(ui_path(name)), "LoadImage")
        assert [n["widgets_values"] for n in load_image] == [["example.png", "image"]]


def test_the_seed_sweep_is_one_prompt_several_seeds_and_a_save_for_every_clip():
    """workflows/wan22_ti2v_5b_seed_sweep.json: one prompt made batch_count times by Generate Batch with
    seeds seed .. seed+N-1, every clip saved, and its Note says its seeds."""
    name = "wan22_ti2v_5b_seed_sweep"
    ui, api = load(ui_path(name)), load(api_path(name))
    (batch,) = nodes_of(ui, "VLLMOmniGenerateBatch")
    values = widgets_by_name(node_defs()["VLLMOmniGenerateBatch"], batch)
    assert len(prompt_lines(values["prompts"])) == 1 and values["batch_count"] >= 2
    assert values["control_after_generate"] == "fixed"          # the sweep repeats until the user moves it
    seeds = [seed for _, seed in clip_plan(values["prompts"], values["seed"], values["batch_count"],
                                           LocalConfig().max_batch_clips)]
    assert seeds == list(range(values["seed"], values["seed"] + values["batch_count"]))
    note = nodes_of(ui, "Note")[0]["widgets_values"][0]
    said = re.search(r"(\d+) clips on one GPU", note) and re.search(r"\((\d+) to (\d+) here", note)
    assert said and int(re.search(r"(\d+) clips", note)[1]) == len(seeds)
    assert [int(said[1]), int(said[2])] == [seeds[0], seeds[-1]]
    (save,) = [e for e in api.values() if e["class_type"] == "SaveVideo"]
    source = api[save["inputs"]["video"][0]]
    assert source["class_type"] == "VLLMOmniGenerateBatch"
    assert node_defs()["VLLMOmniGenerateBatch"].cls.outputs[save["inputs"]["video"][1]].is_list   # once per clip
    assert save["inputs"]["filename_prefix"].startswith("video/")
