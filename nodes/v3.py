"""Our node declarations (schema.py) as ComfyUI V3 nodes of one pinned, versioned API module.

ComfyUI keeps each `comfy_api.v0_0_N` stable while `latest` moves: the pack imports `PINNED` only, here,
when ComfyUI calls `comfy_entrypoint`, and a ComfyUI without it or older than `NEEDS` gets one sentence
instead of a half-registered pack. define_schema is the declaration, execute one `Node.call`,
validate_inputs `Node.validate` for the combo of this machine's entries (`prompt_checked`),
fingerprint_inputs the `fingerprint` where there is one.
"""
from __future__ import annotations

import importlib
import inspect
from typing import Any

from .comfy_bridge import PINNED
from .schema import CATEGORY, WIDGETS, Input, Node, Output

NEEDS = (0, 3, 64)            # the ComfyUI release this pack's V3 nodes were tested with first
_IO_TYPES = {"IMAGE": "Image", "MASK": "Mask", "AUDIO": "Audio", "VIDEO": "Video", "INT": "Int",  # ComfyUI's
             "FLOAT": "Float", "STRING": "String", "BOOLEAN": "Boolean"}


class ComfyUITooOld(Exception):
    """This ComfyUI lacks the pinned V3 API (its message is the one log line ComfyUI prints)."""


def api() -> Any:
    """The pinned module, or ComfyUITooOld saying which ComfyUI the pack needs."""
    try:                                   # the running ComfyUI's version (its comfyui_version.py)
        found: Any = tuple(int(p) for p in importlib.import_module("comfyui_version").__version__.split(".")[:3])
    except (ImportError, AttributeError, ValueError):
        found = None
    try:
        module = importlib.import_module(PINNED)
        module.io.ComfyNode, module.io.Schema, module.ComfyExtension  # noqa: B018 (the names we use)
    except (ImportError, AttributeError):
        module = None
    if module is None or (found is not None and found < NEEDS):
        raise ComfyUITooOld(f"vLLM-Omni Launcher needs ComfyUI {'.'.join(map(str, NEEDS))} or newer (its {PINNED} "
                            f"node API); this is ComfyUI {'.'.join(map(str, found)) if found else 'one without it'}, "
                            "so no vLLM-Omni node is registered: update ComfyUI")
    return module


def extension(nodes: list[Node]) -> Any:
    """The ComfyExtension that `comfy_entrypoint` returns: every node, built against the pinned API."""
    module = api()
    classes = [node_class(node, module) for node in nodes]

    class VLLMOmniExtension(module.ComfyExtension):
        async def get_node_list(self) -> list:
            return classes

    return VLLMOmniExtension()


def node_class(node: Node, module: Any) -> type:
    """One V3 node class for `node`."""
    io, ui = module.io, module.ui

    def io_type(kind: str) -> Any:        # ComfyUI's own types; io.Custom for our handle, model, serving
        return getattr(io, _IO_TYPES[kind]) if kind in _IO_TYPES else io.Custom(kind)

    def v3_input(spec: Input) -> Any:
        common = {"optional": spec.optional, "tooltip": spec.tooltip}
        if spec.kind == "COMBO":
            return io.Combo.Input(spec.name, options=spec.choices(), default=spec.default, **common)
        if spec.kind in WIDGETS:
            return io_type(spec.kind).Input(spec.name, default=spec.default, **common, **spec.opts)
        return io_type(spec.kind).Input(spec.name, **common)

    def v3_output(out: Output) -> Any:
        return io_type(out.kind).Output(display_name=out.name, tooltip=out.tooltip, is_output_list=out.is_list)

    def define_schema(cls: type) -> Any:
        return io.Schema(node_id=node.node_id, display_name=node.display_name, category=CATEGORY,
                         description=node.description, inputs=[v3_input(i) for i in node.inputs()],
                         outputs=[v3_output(o) for o in node.outputs],
                         hidden=[io.Hidden[name] for name in node.hidden], is_output_node=node.output_node)

    def execute(cls: type, **values: Any) -> Any:
        hidden = {name: getattr(cls.hidden, name) for name in node.hidden}
        result = node.call(values, hidden)
        return io.NodeOutput(*result, ui=ui.PreviewText(result[0]) if node.shows_text else None)

    def validate_inputs(cls: type, **values: Any) -> Any:
        return node.validate(values)

    checked = prompt_checked(node)
    validate_inputs.__signature__ = inspect.Signature(   # type: ignore[attr-defined]
        [inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD) for name in ("cls", *checked)])
    body: dict[str, Any] = {"define_schema": classmethod(define_schema), "execute": classmethod(execute),
                            "__doc__": node.description, "__module__": __name__}
    if checked:
        body["validate_inputs"] = classmethod(validate_inputs)
    if node.fingerprint is not None:
        fingerprint = node.fingerprint
        body["fingerprint_inputs"] = classmethod(lambda cls, **values: fingerprint(**values))
    return type(node.node_id, (io.ComfyNode,), body)


def prompt_checked(node: Node) -> list[str]:
    """The one input validate_inputs names, or none: the combo whose list is this machine's (its files,
    its config), the one a workflow from elsewhere gets wrong. ComfyUI (0.3.64, execution.py) hands
    validate_inputs only the inputs its signature names, skips its own checks of those, and attaches the
    one string it returns to every one of them: naming two would show a LoRA's message under `expert`
    too. ComfyUI does not compare a V3 combo with its list, so a fixed-list combo's wrong value is
    refused when the node runs (schema.check_inputs), in the same words."""
    return [i.name for i in node.inputs() if i.kind == "COMBO" and i.own_choice]   # at most one (a unit test)
