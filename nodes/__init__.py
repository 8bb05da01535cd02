"""ComfyUI nodes in ComfyUI's V3 schema: a thin layer over server/, client/ and planner/.

Node ids carry the `VLLMOmni` prefix and never change: workflows store them. So do input
names, their order (saved UI workflows store widget values by position) and their defaults.

Each node is a declaration (`schema.Node`: id, inputs, outputs, `run`: its one call into session.py
/ batch_session.py, which hold the work); ComfyUI calls the package's `comfy_entrypoint`, and v3.py
makes each of `NODES` an `io.ComfyNode` of the pinned `comfy_api.v0_0_2` (define_schema, execute,
validate_inputs, fingerprint_inputs). Nothing here imports ComfyUI before that call.

How to add a V3 node here:
1. In a new module `nodes/<what>_node.py`, declare `MY_NODE = Node("VLLMOmni<Name>", "vLLM-Omni
   <Name>", description, inputs, outputs, run)`: `inputs` a function returning `schema.Input`s
   (kinds: INT FLOAT STRING BOOLEAN COMBO, ComfyUI's IMAGE MASK AUDIO VIDEO, or our link types
   of handles.py), every one with a tooltip; `outputs` `schema.Output`s; `run(**checked_values,
   unique_id=...)` makes one call into the core and returns the outputs as a tuple (MASK, AUDIO and
   VIDEO values reach it unchecked: check them before anything is sent). Widgets added to a
   released node go last and `optional=True` with a default.
2. Append it to `NODES` below. Nothing else: the V3 class, its input checks (schema.check_inputs)
   and the combo validation at /prompt come from the declaration.
3. Tests: tests/unit/test_node_tooltips_and_report_text.py (schema, tooltips) and test_workflow_values.py (every
   input refuses wrong values) cover every node of `NODES`; tests/comfyui runs them in ComfyUI.
"""
from __future__ import annotations

from typing import Any

from .generate_node import GENERATE_BATCH, GENERATE_VIDEO
from .model_nodes import LOAD_MODEL, LORA, SERVING_CONFIG
from .pipeline_nodes import GENERATE_S2V, GENERATE_VACE, LOAD_PIPELINE_MODEL
from .schema import Node
from .server_nodes import DOCTOR, LOCAL_SERVER, REMOTE_SERVER, SERVER_STATUS, STOP_SERVER

NODES: dict[str, Node] = {node.node_id: node for node in (
    LOAD_MODEL, SERVING_CONFIG, LORA, LOCAL_SERVER, REMOTE_SERVER, GENERATE_VIDEO, GENERATE_BATCH, STOP_SERVER,
    SERVER_STATUS, DOCTOR, LOAD_PIPELINE_MODEL, GENERATE_VACE, GENERATE_S2V)}


def comfy_entrypoint() -> Any:
    """ComfyUI's V3 entry point: the extension with every node (v3.py). On a ComfyUI without the
    pinned API it raises v3.ComfyUITooOld, which ComfyUI logs as one line naming the version needed."""
    from ..server import registry
    from . import comfy_bridge, v3

    comfy_bridge.register_user_directory()      # the config file and data dir under ComfyUI's user/
    extension = v3.extension(list(NODES.values()))
    # ComfyUI has no shutdown hook for custom nodes: stop our servers on exit and on SIGTERM/SIGINT
    # (chained to ComfyUI's own handlers). Signal handlers need the main thread, where ComfyUI calls us.
    registry.install_exit_handlers()
    # `prestart_last_server`: start the last Local Server's server now, in the background (never raises).
    from . import prestart

    prestart.maybe_start()
    return extension
