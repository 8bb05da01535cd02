"""The two graphs of the head-to-head (API format), per family, both ending in the same sink: ComfyUI's own
template graph (native) and our template (Load Model -> Serving Config -> Local Server -> Generate Video).

TI2V-5B: ComfyUI's "Wan2.2 5B" template, text to video: UNETLoader -> ModelSamplingSD3 (shift 8) -> KSampler
(uni_pc, simple, cfg 5) with CLIPLoader (type wan) -> CLIPTextEncode x2 and Wan22ImageToVideoLatent, then
VAEDecode; ours: workflows/api/wan22_ti2v_5b_text_to_video, guidance 5, flow_shift 8, the server's UniPC.

T2V-A14B: ComfyUI's "Wan2.2 14B text to video" template (comfyui-workflow-templates 0.1.95,
video_wan2_2_14B_t2v.json), its fp8_scaled group without the 4-step LoRA: two UNETLoaders (high- and
low-noise fp8_scaled, weight_dtype default) -> ModelSamplingSD3 shift 8 each; CLIPLoader (type wan) ->
CLIPTextEncode x2; EmptyHunyuanLatentVideo; KSamplerAdvanced on the high-noise expert for steps [0, steps/2)
(add_noise on, leftover noise returned) then on the low-noise one for [steps/2, end) (add_noise off), both
euler / simple / cfg 3.5; VAEDecode. (The template's enabled group adds the lightx2v 4-step LoRAs with cfg 1
and shift 5: a distilled-LoRA workflow, not the model's own sampling.) Ours: workflows/api/
wan22_t2v_a14b_2gpu_ulysses with its Serving Config reset to the node's defaults (one GPU here: `auto`
plans it), guidance 3.5 on both experts, flow_shift 8, sampler euler (the same family as ComfyUI's euler),
the model's boundary_ratio 0.875 (by timestep: with shift 8 about the same half of the steps).

T2V-A14B, variant `lightx2v_4step` (both sides, `--native-variants` / `--ours-variants`): the template's
ENABLED group, what a ComfyUI user runs: the same graph with LoraLoaderModelOnly (strength 1.0) between each
UNETLoader and its ModelSamplingSD3, shift 5, cfg 1, 4 steps split at 2, euler / simple; ours:
workflows/api/wan22_t2v_a14b_4step_lora (one VLLMOmniLora per expert, strength 1: fused at startup) with its
Serving Config reset to the node's defaults (one GPU), guidance 1 / guidance_2 1, flow_shift 5, euler. Its
rows of the combined table are paired as "lora4 ...".
"""
from __future__ import annotations

import json
from typing import Any, Optional

from .common import REPO
from .families import T2V_A14B, TI2V_5B

PROMPT = ("A red fox trotting through fresh snow in a birch forest at sunrise, soft golden light, slow tracking "
          "shot, cinematic")
NEGATIVE = "blurry, low quality, distorted faces, jitter, flicker, watermark, text, static frame"
SINK = {"90": "GetImageSize", "91": "width", "92": "height", "93": "batch"}
KSAMPLER, DECODE = "3", "8"
KSAMPLER_2 = "4"          # A14B: the low-noise expert's KSamplerAdvanced


def legacy() -> Any:
    """bench/gpu_comfyui_e2e.py, whose imports put bench/ and tests/comfyui on the path: Comfy and Websocket
    (bench/comfyui_process.py), load_api and node_of (bench/comfyui_e2e_reading.py) through it."""
    import sys

    sys.path.insert(0, str(REPO / "bench"))
    import gpu_comfyui_e2e

    return gpu_comfyui_e2e


def sink(prompt: dict, image: list) -> dict:
    """The bench sink on an IMAGE output: its size and frame count as Preview Any text, nothing encoded."""
    prompt["90"] = {"class_type": "GetImageSize", "inputs": {"image": image}}
    for slot, name in enumerate(("width", "height", "batch")):
        prompt[f"9{slot + 1}"] = {"class_type": "PreviewAny", "inputs": {"source": ["90", slot]},
                                  "_meta": {"title": name}}
    return prompt


# Native speed variants a user sets in the graph (ComfyUI flags such as --fast need a ComfyUI of their own:
# --comfy-arg): the UNET loader's fp8 weights, ComfyUI's EasyCache node at its defaults (verbose: its log
# says how many steps it skipped).
EASYCACHE = {"reuse_threshold": 0.2, "start_percent": 0.15, "end_percent": 0.95, "verbose": True}
NATIVE_VARIANTS: dict[str, dict[str, Any]] = {
    "default": {}, "fp8": {"weight_dtype": "fp8_e4m3fn"}, "easycache": {"easycache": EASYCACHE},
    "fp8_easycache": {"weight_dtype": "fp8_e4m3fn", "easycache": EASYCACHE}}
# Our variants: Serving Config widget values (the node's own speed settings; `compile` false = eager).
# parallel_mode none: exactly these settings (with auto the planner would use fp8 only where nothing else fits).
_EXACT = {"parallel_mode": "none", "offload": "none", "vae_tiling": False}
# ... and the node's own defaults (parallel_mode auto: the planner picks; compile on), alone or with the
# `speed` fast levers (compile + FP8 DiT weights): the settings a user gets without touching the node.
AUTO_VARIANTS: dict[str, dict[str, Any]] = {"auto": {}, "auto_fast": {"compile": True, "fp8": True, "speed": "fast"}}
FAST_VARIANTS = ("auto_fast",)     # paired with ComfyUI --fast in the combined table
OURS_VARIANTS: dict[str, dict[str, Any]] = {name: dict(_EXACT, **v) for name, v in {
    "eager": {"compile": False}, "compile": {"compile": True},
    "cache_dit": {"compile": False, "cache_backend": "cache_dit"}, "fp8": {"compile": False, "fp8": True},
    "fp8_cache_dit": {"compile": False, "fp8": True, "cache_backend": "cache_dit"},
    "compile_cache_dit": {"compile": True, "cache_backend": "cache_dit"},
    "compile_fp8_cache_dit": {"compile": True, "fp8": True, "cache_backend": "cache_dit"}}.items()}
# Variants that change the sampling recipe too (the same name on both sides): cfg / guidance, shift, the
# distill LoRAs (native: LoraLoaderModelOnly per expert), our template (its LoRA nodes), the combined table's row.
RECIPES: dict[str, dict[str, Any]] = {
    "lightx2v_4step": {"family": T2V_A14B.name, "cfg": 1.0, "shift": 5.0, "loras": T2V_A14B.loras,
                       "template": "wan22_t2v_a14b_4step_lora", "pair": "lora4"}}
NATIVE_VARIANTS.update({name: {} for name in RECIPES})
AUTO_VARIANTS.update({name: {} for name in RECIPES})       # ours: the node's defaults (one GPU: auto plans it)
SAMPLE_FROM, SAMPLE_FRAMES = 40, 4      # frames saved as PNG per run (the PSNR drift between variants)


def sample_frames(prompt: dict, image: list, prefix: str, frames: int) -> dict:
    """A few frames of the run's IMAGE saved as PNG (ImageFromBatch -> SaveImage) for the PSNR drift."""
    start = min(SAMPLE_FROM, max(0, frames - SAMPLE_FRAMES))
    prompt["94"] = {"class_type": "ImageFromBatch", "inputs": {"image": image, "batch_index": start,
                                                                "length": min(SAMPLE_FRAMES, frames)}}
    prompt["95"] = {"class_type": "SaveImage", "inputs": {"images": ["94", 0], "filename_prefix": prefix}}
    return prompt


def native_prompt(request: dict, *, weight_dtype: str = "default", shift: float = 8.0, cfg: float = 5.0,
                  sampler: str = "uni_pc", scheduler: str = "simple", easycache: Optional[dict] = None) -> dict:
    """ComfyUI's Wan2.2 5B template graph (API format), text-to-video, ending in the sink; `easycache`:
    ComfyUI's EasyCache node between the model sampling patch and the sampler, with these inputs."""
    r = request
    files = {k: name for k, (_, name) in TI2V_5B.files.items()}
    prompt = {
        "37": {"class_type": "UNETLoader", "inputs": {"unet_name": files["unet"], "weight_dtype": weight_dtype}},
        "38": {"class_type": "CLIPLoader", "inputs": {"clip_name": files["te"], "type": "wan", "device": "default"}},
        "39": {"class_type": "VAELoader", "inputs": {"vae_name": files["vae"]}},
        "48": {"class_type": "ModelSamplingSD3", "inputs": {"model": ["37", 0], "shift": shift}},
        "6": {"class_type": "CLIPTextEncode", "inputs": {"text": r["prompt"], "clip": ["38", 0]}},
        "7": {"class_type": "CLIPTextEncode", "inputs": {"text": r["negative"], "clip": ["38", 0]}},
        "55": {"class_type": "Wan22ImageToVideoLatent",
               "inputs": {"vae": ["39", 0], "width": r["width"], "height": r["height"], "length": r["frames"],
                          "batch_size": 1}},
        KSAMPLER: {"class_type": "KSampler",
                   "inputs": {"model": ["49", 0] if easycache else ["48", 0], "positive": ["6", 0],
                              "negative": ["7", 0],
                              "latent_image": ["55", 0], "seed": r["seed"], "steps": r["steps"], "cfg": cfg,
                              "sampler_name": sampler, "scheduler": scheduler, "denoise": 1.0}},
        DECODE: {"class_type": "VAEDecode", "inputs": {"samples": [KSAMPLER, 0], "vae": ["39", 0]}},
    }
    if easycache:
        prompt["49"] = {"class_type": "EasyCache", "inputs": dict(easycache, model=["48", 0])}
    return sink(prompt, [DECODE, 0])


def serving_defaults() -> dict[str, Any]:
    """Serving Config's widget defaults, read off the node's declaration (planner ServingChoice)."""
    import dataclasses

    from .common import import_package

    import_package()
    from vllm_omni_launcher.planner.launch_plan import ServingChoice

    return {f.name: f.default for f in dataclasses.fields(ServingChoice)}


def serving_of(variant: str) -> dict[str, Any]:
    """Serving Config inputs of one of our variants (an AUTO one starts from the node's defaults)."""
    if variant in AUTO_VARIANTS:
        return dict(serving_defaults(), **AUTO_VARIANTS[variant])
    return dict(OURS_VARIANTS[variant])


def native_prompt_a14b(request: dict, *, weight_dtype: str = "default", shift: float = 8.0, cfg: float = 3.5,
                       sampler: str = "euler", scheduler: str = "simple", easycache: Optional[dict] = None,
                       loras: tuple[str, ...] = ()) -> dict:
    """ComfyUI's Wan2.2 14B text-to-video template graph (its fp8_scaled group), ending in the sink: the
    high-noise expert samples the first half of the steps, the low-noise one the rest. `loras` (high-noise,
    low-noise file): the template's enabled group, a LoraLoaderModelOnly (strength 1) after each UNETLoader."""
    if easycache:
        raise ValueError("EasyCache is a TI2V-5B variant here (one sampler); the A14B graph has two")
    r = request
    files = {k: name for k, (_, name) in T2V_A14B.files.items()}
    split = r["steps"] // 2
    high, low = ("101", "102") if loras else ("37", "36")      # what each ModelSamplingSD3 patches

    def stage(model: str, first: bool, latent: list) -> dict:
        return {"class_type": "KSamplerAdvanced",
                "inputs": {"model": [model, 0], "positive": ["6", 0], "negative": ["7", 0], "latent_image": latent,
                           "add_noise": "enable" if first else "disable", "noise_seed": r["seed"] if first else 0,
                           "steps": r["steps"], "cfg": cfg, "sampler_name": sampler, "scheduler": scheduler,
                           "start_at_step": 0 if first else split, "end_at_step": split if first else 10000,
                           "return_with_leftover_noise": "enable" if first else "disable"}}

    prompt = {
        "37": {"class_type": "UNETLoader", "inputs": {"unet_name": files["unet"], "weight_dtype": weight_dtype}},
        "36": {"class_type": "UNETLoader", "inputs": {"unet_name": T2V_A14B.unet_aliases[0],
                                                      "weight_dtype": weight_dtype}},
        "38": {"class_type": "CLIPLoader", "inputs": {"clip_name": files["te"], "type": "wan", "device": "default"}},
        "39": {"class_type": "VAELoader", "inputs": {"vae_name": files["vae"]}},
        "48": {"class_type": "ModelSamplingSD3", "inputs": {"model": [high, 0], "shift": shift}},
        "47": {"class_type": "ModelSamplingSD3", "inputs": {"model": [low, 0], "shift": shift}},
        "6": {"class_type": "CLIPTextEncode", "inputs": {"text": r["prompt"], "clip": ["38", 0]}},
        "7": {"class_type": "CLIPTextEncode", "inputs": {"text": r["negative"], "clip": ["38", 0]}},
        "55": {"class_type": "EmptyHunyuanLatentVideo",
               "inputs": {"width": r["width"], "height": r["height"], "length": r["frames"], "batch_size": 1}},
        KSAMPLER: stage("48", True, ["55", 0]),
        KSAMPLER_2: stage("47", False, [KSAMPLER, 0]),
        DECODE: {"class_type": "VAEDecode", "inputs": {"samples": [KSAMPLER_2, 0], "vae": ["39", 0]}},
    }
    for node, unet, name in zip((high, low), ("37", "36"), loras):
        prompt[node] = {"class_type": "LoraLoaderModelOnly",
                        "inputs": {"model": [unet, 0], "lora_name": name, "strength_model": 1.0}}
    return sink(prompt, [DECODE, 0])


def ours_prompt(template: dict, model: str, request: dict, serving: Optional[dict] = None,
                guidance: float = 5.0, shift: float = 8.0, sampler: str = "unipc",
                guidance_2: Optional[float] = None) -> dict:
    """Our template pointed at `model`, the same request, Generate's IMAGE into the sink (`guidance_2`: the
    A14B low-noise expert's CFG)."""
    lg = legacy()
    prompt = json.loads(json.dumps(template))
    prompt[lg.node_of(prompt, "VLLMOmniLoadModel")]["inputs"]["model"] = model
    prompt[lg.node_of(prompt, "VLLMOmniServingConfig")]["inputs"].update(serving or {})
    gen = lg.node_of(prompt, "VLLMOmniGenerateVideo")
    r = request
    prompt[gen]["inputs"].update(prompt=r["prompt"], negative_prompt=r["negative"], width=r["width"],
                                 height=r["height"], frames=r["frames"], fps=r["fps"], steps=r["steps"],
                                 seed=r["seed"], guidance=guidance, flow_shift=shift, sampler=sampler)
    if guidance_2 is not None:
        prompt[gen]["inputs"]["guidance_2"] = guidance_2
    for key in [k for k, e in prompt.items() if e["class_type"] in ("SaveVideo", "SaveImage")]:
        del prompt[key]
    return sink(prompt, [gen, 0])




# Per family: the native graph, our template, the shared sampling settings and the request's defaults.
SETUPS: dict[str, dict[str, Any]] = {
    "ti2v-5b": {"native": native_prompt, "template": "wan22_ti2v_5b_text_to_video", "cfg": 5.0, "shift": 8.0,
                "ours_sampler": "unipc", "guidance_2": None, "width": 1280, "height": 704, "frames": 121, "fps": 24,
                "samplers": (KSAMPLER,), "step_guess_s": 3.0, "first_s": 90.0},
    "t2v-a14b": {"native": native_prompt_a14b, "template": "wan22_t2v_a14b_2gpu_ulysses", "cfg": 3.5, "shift": 8.0,
                 "ours_sampler": "euler", "guidance_2": 3.5, "width": 832, "height": 480, "frames": 81, "fps": 16,
                 "samplers": (KSAMPLER, KSAMPLER_2), "step_guess_s": 8.0, "first_s": 150.0},
}
