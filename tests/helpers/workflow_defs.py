"""The templates in workflows/ and the node definitions the front end sees, described without ComfyUI.

The front end stores widget values by *position* (``widgets_values``) and adds widgets of its own
(``control_after_generate`` after a seed, upload buttons): `node_defs` builds each node's widget list
the way the front end does, for our nodes (from their declarations) and for the core nodes the
templates use (``CORE_NODES``, ComfyUI 0.3.64's /object_info); `value_problem`, `widget_problems` and
`api_input_problems` say what a saved value or API input gets wrong; `ui_to_api` is graphToPrompt().

Shared by the unit tests of the templates (tests/unit/test_workflows.py, test_template_plans.py,
test_template_run_on_stub.py) and tests/comfyui/run_real_comfyui.py, which checks ``CORE_NODES`` and
our input order against a real ComfyUI.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from vllm_omni_launcher.nodes import NODES
from vllm_omni_launcher.nodes.schema import Node

REPO = Path(__file__).resolve().parents[2]
WORKFLOWS = REPO / "workflows"
API_DIR = WORKFLOWS / "api"
RELEASED = REPO / "tests" / "unit" / "released_workflows"

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
