"""Doctor node: what is wrong with this machine for vLLM-Omni, and how to fix it."""
from __future__ import annotations

from typing import Optional

from . import session
from .handles import MODEL_TYPE, ModelChoice


class Doctor:
    """GPUs, peer-to-peer, the server environment's versions, disk, ports: each problem with its fix."""

    DESCRIPTION = ("Checks this machine for vLLM-Omni: GPUs and peer-to-peer access, memory ComfyUI holds, the "
                   "server environment's vllm / vllm-omni pair, disk, the model folder, the Diffusers folders Load "
                   "Model leaves out and the port; each problem with its fix. The report starts with the verdict "
                   "(problems and warnings by name, and whether this is a GPU box or a client-only one), so it "
                   "reads at the node's default size. Runs every time it is queued; the report shows on the node "
                   "and in its output.")
    CATEGORY = "vLLM-Omni"
    RETURN_TYPES = ("STRING",)
    RETURN_NAMES = ("report",)
    OUTPUT_TOOLTIPS = ("the doctor report (also shown on the node); wire it to Preview Any to keep it",)
    FUNCTION = "check"
    OUTPUT_NODE = True

    @classmethod
    def INPUT_TYPES(cls):  # noqa: N802
        return {"required": {},
                "optional": {"model": (MODEL_TYPE, {"tooltip": "also check this model: its size against the "
                                                               "disk and the GPUs, its local folder"})},
                "hidden": {"unique_id": "UNIQUE_ID"}}

    @classmethod
    def IS_CHANGED(cls, **_):  # noqa: N802
        return float("nan")   # the machine may have changed; nothing is downstream of it

    def check(self, model: Optional[ModelChoice] = None, unique_id: Optional[str] = None):
        return session.doctor_report(model, unique_id)
