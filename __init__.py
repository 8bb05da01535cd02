"""vLLM-Omni Launcher: ComfyUI nodes that launch, supervise and use vLLM-Omni for Wan2.2 video.

ComfyUI imports this folder as a custom node and calls `comfy_entrypoint` (its V3 entry point;
nodes/__init__.py says how the nodes are built); `pip install -e .` makes the same folder
importable as `vllm_omni_launcher` for the CLI and the tests. The core (server/, client/,
planner/) never imports ComfyUI; nodes/ imports it lazily. Both names below are resolved on
first access, so the CLI and the supervisor's helper processes do not import the node layer.

`NODE_CLASS_MAPPINGS` (the V1 entry, which ComfyUI looks for first) exists only in a ComfyUI
too old for the pinned V3 API: there it registers nothing and logs, once, the one line that
says which ComfyUI the pack needs. In a current ComfyUI it is absent, so ComfyUI takes the V3
entry point.
"""
import functools
import logging
from typing import Any

__all__ = ["comfy_entrypoint"]


@functools.lru_cache(maxsize=1)
def _too_old() -> bool:
    from .nodes import v3

    try:
        v3.api()
    except v3.ComfyUITooOld as too_old:
        logging.getLogger(__name__).warning(str(too_old))
        return True
    return False


def __getattr__(name: str) -> Any:
    if name == "comfy_entrypoint":
        from .nodes import comfy_entrypoint

        return comfy_entrypoint
    if name == "NODE_CLASS_MAPPINGS" and _too_old():
        return {}
    raise AttributeError(name)
