"""vLLM-Omni LoRA: chain one LoRA onto the model, like ComfyUI's LoraLoaderModelOnly.

The LoRA is an entry of ComfyUI's `loras` folders (single .safetensors files by ComfyUI's own
relative names, PEFT folders with a trailing '/'), never a typed path. Whether it is fused into
the server at startup or sent with each request is decided when Local Server runs
(server/loras.py), because it depends on the server's vLLM-Omni version and the whole chain.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from ..errors import LauncherError
from ..server.loras import EXPERTS, MAX_STRENGTH, LoraEntry, find_loras
from . import comfy_bridge
from .handles import MODEL_TYPE, ModelChoice

CATEGORY = "vLLM-Omni"


def _loras() -> dict[str, Path]:
    return find_loras(comfy_bridge.lora_folders())


def choose_lora(name: str, strength: float, expert: str) -> LoraEntry:
    """The list entry `name` as a LoraEntry. Anything not in the list gets one message, whether or
    not such a path exists, so a workflow can neither open nor probe other paths."""
    path = _loras().get(name)
    if path is None:
        raise LauncherError(
            f"LoRA '{name}' is not one of the LoRA node's choices on this machine",
            "the node takes .safetensors files and PEFT folders (adapter_config.json + "
            "adapter_model.safetensors) found under ComfyUI's models/loras folders; it never opens other paths",
            "put the LoRA under ComfyUI/models/loras, refresh the node definitions (press R) and pick it",
            setting="lora_name")
    if expert not in EXPERTS:
        raise LauncherError(f"LoRA expert '{expert}' is not known", f"allowed: {', '.join(EXPERTS)}",
                            "pick both, high_noise or low_noise", setting="expert")
    return LoraEntry(str(path), float(strength), expert, name)  # type: ignore[arg-type]


class LoraModel:
    """Add one LoRA to the model; chain several nodes for several LoRAs (A14B: one per expert)."""

    DESCRIPTION = ("Adds a LoRA to the Wan2.2 model. Single .safetensors files (ComfyUI / lightx2v format) are "
                   "fused into the server when it starts (vLLM-Omni 0.30; a change of file or strength restarts "
                   "the server; a strength other than 1.0 fuses a scaled copy kept in the launcher's data dir; "
                   "A14B needs one file per expert, or one for both); PEFT folders are applied "
                   "per request (0.26 and 0.30; any strength; one per request; no restart). The choice is "
                   "shown on Local Server.")
    CATEGORY = CATEGORY
    RETURN_TYPES = (MODEL_TYPE,)
    RETURN_NAMES = ("model",)
    OUTPUT_TOOLTIPS = ("the model with this LoRA appended: connect to Local Server or another LoRA node",)
    FUNCTION = "apply"
    OWN_CHOICE_CHECKS = ("lora_name",)   # choose_lora says where entries come from (input_checks.py)

    @classmethod
    def INPUT_TYPES(cls):  # noqa: N802
        return {"required": {
            "model": (MODEL_TYPE, {"tooltip": "the model from Load Wan2.2 Model (or another LoRA node)"}),
            "lora_name": (sorted(_loras()), {
                "tooltip": "a LoRA under ComfyUI/models/loras: a .safetensors file, or a PEFT folder (ends in /)"}),
            "strength": ("FLOAT", {"default": 1.0, "min": 0.0, "max": MAX_STRENGTH, "step": 0.05,
                                   "tooltip": "LoRA strength (2-3 on the high-noise expert is common); a "
                                              "single-file LoRA at another value than 1.0 is fused from a "
                                              "scaled copy, made once in the launcher's data dir"}),
            "expert": (list(EXPERTS), {
                "default": "both",
                "tooltip": "A14B: which expert it applies to (high_noise = early steps, low_noise = late steps); "
                           "ignored for TI2V-5B, which has one transformer"}),
        }}

    def apply(self, model: ModelChoice, lora_name: str, strength: float, expert: str):
        entry = choose_lora(lora_name, strength, expert)
        return (replace(model, loras=(*model.loras, entry)),)
