"""Load Model, LoRA and Serving Config nodes: what to serve, and how.

A LoRA is chained onto the model like ComfyUI's LoraLoaderModelOnly: an entry of ComfyUI's `loras`
folders (single .safetensors files by their relative names, PEFT folders with a trailing '/'), never
a typed path. Whether it is fused at startup or sent per request is decided when Local Server runs
(server/launch/loras.py): it depends on the server's vLLM-Omni version and the whole chain.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

from ..errors import LauncherError
from ..models import FAMILIES, LOCAL_PREFIX, LocalModel, find_local_models
from ..server.config.config_values import shown
from ..server.config.settings import settings_of
from ..server.launch.loras import EXPERTS, MAX_STRENGTH, LoraEntry, find_loras
from . import comfy_bridge
from .handles import MODEL_TYPE, SERVING_TYPE, ModelChoice, ServingChoice
from .schema import Input, Node, Output, setting_inputs

PRESETS = {f.hf_id: f for f in FAMILIES.values()}


def _local_models() -> dict[str, LocalModel]:
    return find_local_models(comfy_bridge.diffusers_folders())


def choose_model(name: str) -> ModelChoice:
    """A Load Model entry as the server will be started with it: a preset or a `local/...` entry
    found under ComfyUI's model folders. Anything else gets one message, whether or not such a path
    exists, so a workflow can neither open nor probe other paths."""
    return choose_entry(name, PRESETS, _local_models, "Load Model", (
        "Load Model takes a Wan2.2 preset (the server downloads it) or a local/... entry: a Diffusers "
        "folder found under ComfyUI's models/diffusers folders; it never opens other paths"),
        "the *-Diffusers folder")


def choose_entry(name: Any, presets: dict, local_models: Callable[[], dict[str, LocalModel]], node: str,
                 why: str, folder: str) -> ModelChoice:
    """One model list's entry (Load Model's, Load Wan Pipeline Model's): a preset id or a `local/...`
    folder that node lists; any other name, or a value that is not text at all (a workflow may send
    anything), gets the node's one message, quoted and cut by `shown`, and no path is opened."""
    text = name if isinstance(name, str) else None
    if text in presets:
        return ModelChoice(text, presets[text].key, text)
    local = local_models().get(text) if text is not None and text.startswith(LOCAL_PREFIX) else None
    if local is None:
        raise LauncherError(
            f"{node} got {shown(name)}, which is not one of {node}'s choices on this machine", why,
            f"pick an entry from the list; for your own copy, put {folder} under ComfyUI/models/diffusers and "
            "refresh the node definitions (press R in ComfyUI)", setting="model")
    return ModelChoice(str(local.path), local.family.key, text)


LOAD_MODEL = Node(
    "VLLMOmniLoadModel", "vLLM-Omni Load Wan2.2 Model",
    "Wan2.2 model for vLLM-Omni: T2V-A14B (text), I2V-A14B (image), TI2V-5B (text or image). Presets are "
    "downloaded by the server on its first start (A14B about 65 GB, TI2V-5B about 23 GB); local/... entries are "
    "Diffusers folders found, at any depth, under ComfyUI's models/diffusers folders. Only entries of this list "
    "are accepted.",
    lambda: [Input("model", "COMBO", "a Wan2.2 Diffusers preset (Hugging Face id, downloaded on first start), or "
                   "local/<path> for a folder under ComfyUI/models/diffusers (must contain model_index.json)",
                   default=FAMILIES["ti2v_5b"].hf_id, own_choice=True, choose=choose_model,
                   options=lambda: [*PRESETS, *sorted(_local_models())])],
    (Output(MODEL_TYPE, "model", "the model to serve: connect to Local Server (or Doctor)"),),
    lambda model: (choose_model(model),), hidden=())

# Declared once, in ServingChoice (planner/launch_plan.py): types, choices, defaults and tooltips;
# saved workflows store the values by position, in that declaration order. Widgets appended after
# a release (replicas) are optional inputs: missing, they take their default.
SERVING_CONFIG = Node(
    "VLLMOmniServingConfig", "vLLM-Omni Serving Config",
    "Serving configuration. parallel_mode 'auto' lets the memory planner choose the fastest configuration that "
    "fits your GPUs (shown on Local Server), and auto_fallback steps down (tiling, offload) by itself if the "
    "server still runs out of memory. The program, host, keys and memory limits come from the local launcher "
    "config, never from here.",
    lambda: setting_inputs(settings_of(ServingChoice)),
    (Output(SERVING_TYPE, "serving", "how to serve the model: connect to Local Server"),),
    lambda **widgets: (ServingChoice(**{**widgets, "gpus": widgets["gpus"].strip() or "auto"}),), hidden=())


def _loras() -> dict[str, Path]:
    return find_loras(comfy_bridge.lora_folders())


def lora_path(name: Any) -> Path:
    """The list entry `name`'s file or folder. Anything not in the list (or not text) gets one
    message, whether or not such a path exists, so a workflow can neither open nor probe other paths."""
    path = _loras().get(name) if isinstance(name, str) else None
    if path is None:
        raise LauncherError(
            f"The LoRA node got {shown(name)}, which is not one of the LoRA node's choices on this machine",
            "the node takes .safetensors files and PEFT folders (adapter_config.json + "
            "adapter_model.safetensors) found under ComfyUI's models/loras folders; it never opens other paths",
            "put the LoRA under ComfyUI/models/loras, refresh the node definitions (press R) and pick it",
            setting="lora_name")
    return path


def add_lora(model: ModelChoice, lora_name: str, strength: float, expert: str) -> tuple[ModelChoice]:
    """The model with this LoRA appended to its chain."""
    entry = LoraEntry(str(lora_path(lora_name)), float(strength), expert, lora_name)  # type: ignore[arg-type]
    return (replace(model, loras=(*model.loras, entry)),)


LORA = Node(
    "VLLMOmniLora", "vLLM-Omni LoRA",
    "Adds a LoRA to the Wan2.2 model. Single .safetensors files (ComfyUI / lightx2v format) are fused into the "
    "server when it starts (vLLM-Omni 0.30; a change of file or strength restarts the server; a strength other "
    "than 1.0 fuses a scaled copy kept in the launcher's data dir; A14B needs one file per expert, or one for "
    "both); PEFT folders are applied per request (0.26 and 0.30; any strength; one per request; no restart). The "
    "choice is shown on Local Server.",
    lambda: [
        Input("model", MODEL_TYPE, "the model from Load Wan2.2 Model (or another LoRA node)"),
        Input("lora_name", "COMBO", "a LoRA under ComfyUI/models/loras: a .safetensors file, or a PEFT folder "
              "(ends in /)", own_choice=True, choose=lora_path, options=lambda: sorted(_loras())),
        Input("strength", "FLOAT", "LoRA strength (2-3 on the high-noise expert is common); a single-file LoRA at "
              "another value than 1.0 is fused from a scaled copy, made once in the launcher's data dir",
              default=1.0, opts={"min": 0.0, "max": MAX_STRENGTH, "step": 0.05}),
        Input("expert", "COMBO", "A14B: which expert it applies to (high_noise = early steps, low_noise = late "
              "steps); ignored for TI2V-5B, which has one transformer", default="both", options=tuple(EXPERTS)),
    ],
    (Output(MODEL_TYPE, "model", "the model with this LoRA appended: connect to Local Server or another LoRA "
            "node"),),
    add_lora, hidden=())
