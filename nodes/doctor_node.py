"""Doctor node: what is wrong with this machine for vLLM-Omni, and how to fix it."""
from __future__ import annotations

from ..planner.doctor import run_doctor
from ..server.local_config import load_local_config


class Doctor:
    """GPUs, peer-to-peer, the server environment's versions, disk, ports: each problem with its fix."""

    CATEGORY = "vLLM-Omni"
    RETURN_TYPES = ("STRING",)
    RETURN_NAMES = ("report",)
    FUNCTION = "check"
    OUTPUT_NODE = True

    @classmethod
    def INPUT_TYPES(cls):  # noqa: N802
        return {"required": {}, "optional": {"model": ("VLLM_OMNI_MODEL",)}}

    @classmethod
    def IS_CHANGED(cls, **_):  # noqa: N802
        return float("nan")

    def check(self, model=None):
        report = run_doctor(model.model if model is not None else None, config=load_local_config())
        text = report.text()
        return {"ui": {"text": [text]}, "result": (text,)}
