"""Load model and Serving config nodes: what to serve, and how."""
from __future__ import annotations

import json
from pathlib import Path

from ..errors import LauncherError
from ..models import FAMILIES, family_for
from ..server.spec import CACHE_BACKENDS, OFFLOAD_MODES, PARALLEL_MODES
from . import comfy_bridge
from .handles import MODEL_TYPE, SERVING_TYPE, ModelChoice, ServingChoice

CATEGORY = "vLLM-Omni"
LOCAL_PREFIX = "local/"


def _local_models() -> dict[str, Path]:
    """Wan2.2 Diffusers folders in ComfyUI's model folders, keyed by a path-free label."""
    found: dict[str, Path] = {}
    for root in comfy_bridge.diffusers_folders():
        for child in sorted(root.iterdir()):
            index = child / "model_index.json"
            if not index.is_file():
                continue
            try:
                cls = json.loads(index.read_text()).get("_class_name", "")
            except (OSError, ValueError):
                continue
            if cls in ("WanPipeline", "WanImageToVideoPipeline"):
                found.setdefault(LOCAL_PREFIX + child.name, child)
    return found


class LoadModel:
    """Pick a Wan2.2 model: an HF repo (downloaded by the server on first start) or a local folder."""

    DESCRIPTION = ("Wan2.2 model for vLLM-Omni. HF presets are downloaded by the server on first start; "
                   "local Diffusers folders are listed from ComfyUI's models/diffusers folder.")
    CATEGORY = CATEGORY
    RETURN_TYPES = (MODEL_TYPE,)
    RETURN_NAMES = ("model",)
    FUNCTION = "load"

    @classmethod
    def INPUT_TYPES(cls):  # noqa: N802 (ComfyUI's name)
        presets = [f.hf_id for f in FAMILIES.values()]
        return {"required": {"model": (presets + sorted(_local_models()), {
            "default": FAMILIES["ti2v_5b"].hf_id,
            "tooltip": "HF id of a Wan2.2 Diffusers repo, or a folder under models/diffusers"})}}

    @classmethod
    def VALIDATE_INPUTS(cls, model):  # noqa: N802
        if model.startswith(LOCAL_PREFIX) and model not in _local_models():
            return (f"Local model '{model}' is not in ComfyUI's models/diffusers folders on this machine. "
                    "Fix: copy the Diffusers folder there, or pick an HF preset.")
        return True

    def load(self, model: str):
        path = _local_models().get(model) if model.startswith(LOCAL_PREFIX) else None
        if model.startswith(LOCAL_PREFIX) and path is None:
            raise LauncherError(f"Local model '{model}' not found", "it is not in models/diffusers here",
                                "copy the folder there or pick an HF preset", setting="model")
        target = str(path) if path else model
        return (ModelChoice(target, family_for(target).key),)


class ServingConfig:
    """How the server runs: GPUs, one parallel mode, offload, FP8, VAE tiling, compile, keep-alive."""

    DESCRIPTION = ("Serving configuration. 'auto' lets the memory planner choose the fastest configuration "
                   "that fits your GPUs, and step down (offload, tiling) by itself if the server still "
                   "runs out of memory.")
    CATEGORY = CATEGORY
    RETURN_TYPES = (SERVING_TYPE,)
    RETURN_NAMES = ("serving",)
    FUNCTION = "configure"

    @classmethod
    def INPUT_TYPES(cls):  # noqa: N802
        return {"required": {
            "gpus": ("STRING", {"default": "auto", "tooltip": "auto (planner picks from visible GPUs), all, "
                                                              "ids like 0 or 0,1, or count=2"}),
            "parallel_mode": (["auto", *PARALLEL_MODES], {"default": "auto", "tooltip":
                              "one multi-GPU mode: cfg (2 GPUs, CFG on; best without NVLink), ulysses (speed), "
                              "tensor/hsdp (memory), ring; auto = planner"}),
            "parallel_degree": ("INT", {"default": 2, "min": 1, "max": 8,
                                        "tooltip": "GPUs used by the parallel mode (world size)"}),
            "vae_patch_parallel": ("INT", {"default": 1, "min": 1, "max": 8,
                                           "tooltip": "split the VAE decode across the same GPUs"}),
            "offload": (list(OFFLOAD_MODES), {"default": "none", "tooltip":
                        "module: text encoder and DiT swap via CPU; layerwise: DiT blocks streamed (1 GPU only)"}),
            "fp8": ("BOOLEAN", {"default": False, "tooltip": "FP8 DiT weights (not validated upstream for Wan2.2)"}),
            "vae_tiling": ("BOOLEAN", {"default": False, "tooltip": "lower the VAE decode peak for long/large clips"}),
            "cache_backend": (list(CACHE_BACKENDS), {"default": "none", "tooltip": "cache_dit: reuse DiT blocks"}),
            "compile": ("BOOLEAN", {"default": True, "tooltip": "torch.compile: slower start, faster steps"}),
            "keep_alive_minutes": ("INT", {"default": 0, "min": 0, "max": 1440,
                                           "tooltip": "stop the server after this many idle minutes (0: keep)"}),
            "auto_fallback": ("BOOLEAN", {"default": True, "tooltip":
                              "on out-of-memory, step down to a leaner configuration and retry by itself"}),
        }}

    def configure(self, gpus, parallel_mode, parallel_degree, vae_patch_parallel, offload, fp8, vae_tiling,
                  cache_backend, compile, keep_alive_minutes, auto_fallback):  # noqa: A002 (widget name)
        return (ServingChoice(gpus=gpus.strip() or "auto", parallel_mode=parallel_mode,
                              parallel_degree=parallel_degree, vae_patch_parallel=vae_patch_parallel,
                              offload=offload, fp8=fp8, vae_tiling=vae_tiling, cache_backend=cache_backend,
                              compile=compile, keep_alive_minutes=float(keep_alive_minutes),
                              auto_fallback=auto_fallback),)
