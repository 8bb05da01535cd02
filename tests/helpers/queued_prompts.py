"""Queued ComfyUI prompts (API format), as Local Server reads them from its hidden PROMPT input before
any job exists: Local Server "3" and the Generate nodes its output feeds (or another server's).

Shared by the tests of planner/queued_prompt.py and of the batch plan through the nodes."""
from __future__ import annotations

from typing import Any

SERVER = ("3", 0)            # Local Server "3"'s output, as a linked input names it
JOB = {"negative_prompt": "", "width": 0, "height": 0, "frames": 0, "fps": 0, "steps": 0, "guidance": -1.0,
       "guidance_2": -1.0, "boundary_ratio": -1.0, "flow_shift": -1.0, "seed": 1}


def queued_prompt(**nodes: dict[str, Any]) -> dict[str, Any]:
    """Local Server "3" (its model and serving linked) and the given nodes (id -> class_type and inputs)."""
    prompt = {"3": {"class_type": "VLLMOmniLocalServer", "inputs": {"model": ["1", 0], "serving": ["2", 0]}}}
    prompt.update(nodes)
    return prompt


def batch_node(prompts: Any, batch_count: Any, server: tuple[str, int] = SERVER) -> dict[str, Any]:
    """A Generate Batch node fed by `server`, with the default job widgets."""
    return {"class_type": "VLLMOmniGenerateBatch",
            "inputs": {**JOB, "server": list(server), "prompts": prompts, "batch_count": batch_count}}


def video_node(server: tuple[str, int] = SERVER, **inputs: Any) -> dict[str, Any]:
    """A Generate Video node fed by `server`, with the default job widgets and these overrides."""
    return {"class_type": "VLLMOmniGenerateVideo",
            "inputs": {**JOB, "server": list(server), "prompt": "a cat", **inputs}}
