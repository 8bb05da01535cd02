"""vLLM-Omni Launcher: ComfyUI nodes that launch, supervise and use vLLM-Omni for Wan2.2 video.

ComfyUI imports this folder as a custom node and reads NODE_CLASS_MAPPINGS; `pip install -e .`
makes the same folder importable as `vllm_omni_launcher` for the CLI and the tests. The core
(server/, client/, planner/) never imports ComfyUI; nodes/ imports it lazily at execution.
The node mappings are resolved on first access, so the CLI and the supervisor's helper
processes do not import the node layer at all.
"""
from typing import Any

__all__ = ["NODE_CLASS_MAPPINGS", "NODE_DISPLAY_NAME_MAPPINGS"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from . import nodes

        return getattr(nodes, name)
    raise AttributeError(name)
