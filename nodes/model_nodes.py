"""Load Model and Serving Config nodes: what to serve, and how."""
from __future__ import annotations

from ..errors import LauncherError
from ..models import FAMILIES, LOCAL_PREFIX, LocalModel, find_local_models
from ..server.settings import settings_of
from . import comfy_bridge, setting_inputs
from .handles import MODEL_TYPE, SERVING_TYPE, ModelChoice, ServingChoice

CATEGORY = "vLLM-Omni"
PRESETS = {f.hf_id: f for f in FAMILIES.values()}


def _local_models() -> dict[str, LocalModel]:
    return find_local_models(comfy_bridge.diffusers_folders())


def choose_model(name: str) -> ModelChoice:
    """A Load Model entry as the server will be started with it.

    Only what the list offers is accepted (a preset, or a `local/...` entry found under
    ComfyUI's model folders); anything else gets one message, whether or not such a path
    exists, so a workflow can neither open nor probe other paths.
    """
    if name in PRESETS:
        return ModelChoice(name, PRESETS[name].key, name)
    local = _local_models().get(name) if name.startswith(LOCAL_PREFIX) else None
    if local is None:
        raise LauncherError(
            f"Model '{name}' is not one of Load Model's choices on this machine",
            "Load Model takes a Wan2.2 preset (the server downloads it) or a local/... entry: a Diffusers "
            "folder found under ComfyUI's models/diffusers folders; it never opens other paths",
            "pick an entry from the list; for your own copy, put the *-Diffusers folder under "
            "ComfyUI/models/diffusers and refresh the node definitions (press R in ComfyUI)", setting="model")
    return ModelChoice(str(local.path), local.family.key, name)


class LoadModel:
    """Pick a Wan2.2 model: an HF repo (downloaded by the server on first start) or a local folder."""

    DESCRIPTION = ("Wan2.2 model for vLLM-Omni: T2V-A14B (text), I2V-A14B (image), TI2V-5B (text or image). "
                   "Presets are downloaded by the server on its first start (A14B about 65 GB, TI2V-5B about "
                   "23 GB); local/... entries are Diffusers folders found, at any depth, under ComfyUI's "
                   "models/diffusers folders. Only entries of this list are accepted.")
    CATEGORY = CATEGORY
    RETURN_TYPES = (MODEL_TYPE,)
    RETURN_NAMES = ("model",)
    OUTPUT_TOOLTIPS = ("the model to serve: connect to Local Server (or Doctor)",)
    FUNCTION = "load"
    OWN_CHOICE_CHECKS = ("model",)       # choose_model says where entries come from (input_checks.py)

    @classmethod
    def INPUT_TYPES(cls):  # noqa: N802 (ComfyUI's name)
        return {"required": {"model": ([*PRESETS, *sorted(_local_models())], {
            "default": FAMILIES["ti2v_5b"].hf_id,
            "tooltip": "a Wan2.2 Diffusers preset (Hugging Face id, downloaded on first start), or local/<path> "
                       "for a folder under ComfyUI/models/diffusers (must contain model_index.json)"})}}

    def load(self, model: str):
        return (choose_model(model),)


class ServingConfig:
    """How the server runs: GPUs, one parallel mode, offload, FP8, VAE tiling, compile, keep-alive."""

    DESCRIPTION = ("Serving configuration. parallel_mode 'auto' lets the memory planner choose the fastest "
                   "configuration that fits your GPUs (shown on Local Server), and auto_fallback steps down "
                   "(tiling, offload) by itself if the server still runs out of memory. The program, host, "
                   "keys and memory limits come from the local launcher config, never from here.")
    CATEGORY = CATEGORY
    RETURN_TYPES = (SERVING_TYPE,)
    RETURN_NAMES = ("serving",)
    OUTPUT_TOOLTIPS = ("how to serve the model: connect to Local Server",)
    FUNCTION = "configure"

    @classmethod
    def INPUT_TYPES(cls):  # noqa: N802
        # Declared once, in ServingChoice (planner/launch_plan.py): types, choices, defaults and
        # tooltips; saved workflows store the values by position, in that declaration order.
        # Widgets appended after a release (replicas) are optional inputs: missing, they take their default.
        return setting_inputs.node_inputs(settings_of(ServingChoice))

    def configure(self, **widgets):
        return (ServingChoice(**{**widgets, "gpus": widgets["gpus"].strip() or "auto"}),)
