"""The random distill LoRA of a family's ComfyUI template (T2V-A14B: lightx2v's 4-step pair), for `weights`.

One random LoRA file in ``models/loras`` under both expert names (a hard link: speed only, so one set of
random values does for both experts). One file serves both sides: it is in the
ComfyUI / original-Wan layout (``diffusion_model.blocks.N.<linear>.lora_down.weight`` / ``lora_up.weight`` /
``alpha``, the lightx2v files' layout), which ComfyUI's LoraLoaderModelOnly maps through its generic key map
(comfy/lora.py ``model_lora_keys_unet``: ``diffusion_model.X`` -> weight ``diffusion_model.X.weight``; the
LoRA adapter reads ``X.lora_up.weight`` / ``X.lora_down.weight``, ``load_lora`` the ``X.alpha``) and vLLM-Omni
0.30's fused startup loader converts with diffusers' Wan converter (every block linear it maps: the table of
bench/make_tiny_lora.py, whose files tests/contract/lora_loader_check.py fuses through that real loader).
Rank 64, fp32, as the upstream files (lightx2v's "Wan2.2-T2V-A14B-4steps-lora-rank64-Seko-V1.1", which
Comfy-Org repackaged; its 1.2 GB is rank 64 in fp32 over these linears); values N(0, 1e-3), alpha = rank.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

LORA_RANK, LORA_STD = 64, 1e-3     # small values keep the random DiT finite with the LoRA fused in


def tiny_lora_module() -> Any:
    """bench/make_tiny_lora.py, loaded by path (bench/ is no package, and sys.path stays as it is)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_tiny_lora", Path(__file__).parents[1] / "make_tiny_lora.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def lora_modules() -> tuple[str, ...]:
    """The block linears (`self_attn.q`, ..., `ffn.2`) a ComfyUI-format Wan LoRA covers: make_tiny_lora's table of
    what diffusers' Wan converter maps."""
    return tuple(tiny_lora_module().COMFY_TO_DIFFUSERS)


def lora_tensors(unet: list, rank: int = LORA_RANK) -> list:
    """The distill LoRA's tensors for the ComfyUI diffusion model `unet` (its manifest entries): for every
    block linear of `lora_modules`, down [rank, in], up [out, rank] and a scalar alpha, fp32."""
    wanted = set(lora_modules())
    out = []
    for name, shape, _ in unet:
        parts = name.split(".")
        if parts[0] == "blocks" and name.endswith(".weight") and ".".join(parts[2:-1]) in wanted:
            x = "diffusion_model." + name.removesuffix(".weight")
            out += [[f"{x}.lora_down.weight", [rank, shape[1]], "fp32"],
                    [f"{x}.lora_up.weight", [shape[0], rank], "fp32"], [f"{x}.alpha", [], "fp32"]]
    return out
