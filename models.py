"""What the launcher knows about each Wan2.2 model: identity, shape, rules and defaults.

Upstream vLLM-Omni keys the pipeline on `model_index.json` and silently rewrites bad
request values (frames to 4k+1, sizes floored) or fails the job late (I2V sizes). We keep
the rules here, once, so the spec, the planner, the client and the nodes agree and can
tell the user the nearest valid value before a GPU minute is spent.
"""
from __future__ import annotations

import difflib

import json
import math
import numbers
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Optional

from .errors import LauncherError

if TYPE_CHECKING:
    from .client.request import VideoRequest

LOCAL_PREFIX = "local/"      # Load Model's label for a folder under ComfyUI's model folders


@dataclass(frozen=True)
class WanFamily:
    """One Wan2.2 model family and its upstream-recommended request defaults."""

    key: str                 # stable id used in workflows: "t2v_a14b" | "i2v_a14b" | "ti2v_5b"
    label: str
    hf_id: str
    pipeline_class: str      # model_index.json _class_name
    attention_heads: int
    layers: int
    dit_params_b: float      # parameters per DiT expert, billions
    experts: int             # 2 for the A14B MoE (transformer + transformer_2)
    size_multiple: int       # 16 for A14B (VAE x8, patch 2), 32 for TI2V-5B (VAE x16, patch 2)
    vae_spatial: int         # VAE spatial compression
    latent_channels: int
    image_input: str         # "none" | "required" | "optional"
    # request defaults (Wan2.2 upstream recommendations: docs/upstream-facts.md, "Wan2.2 request defaults")
    width: int
    height: int
    frames: int
    fps: float
    steps: int
    guidance: float
    guidance_2: float
    boundary_ratio: float
    flow_shift: float


FAMILIES: dict[str, WanFamily] = {
    f.key: f
    for f in (
        WanFamily("t2v_a14b", "Wan2.2 T2V-A14B", "Wan-AI/Wan2.2-T2V-A14B-Diffusers", "WanPipeline",
                  40, 40, 14.29, 2, 16, 8, 16, "none",
                  832, 480, 81, 16.0, 40, 4.0, 3.0, 0.875, 12.0),
        WanFamily("i2v_a14b", "Wan2.2 I2V-A14B", "Wan-AI/Wan2.2-I2V-A14B-Diffusers", "WanImageToVideoPipeline",
                  40, 40, 14.29, 2, 16, 8, 16, "required",
                  832, 480, 81, 16.0, 40, 3.5, 3.5, 0.9, 5.0),
        WanFamily("ti2v_5b", "Wan2.2 TI2V-5B", "Wan-AI/Wan2.2-TI2V-5B-Diffusers", "WanPipeline",
                  24, 30, 5.0, 1, 32, 16, 48, "optional",
                  1280, 704, 121, 24.0, 50, 5.0, 5.0, 0.875, 5.0),
    )
}

_BY_HF_ID = {f.hf_id.lower(): f for f in FAMILIES.values()}


def family_for(model: str) -> WanFamily:
    """Identify the Wan2.2 family of an HF id or a local Diffusers folder.

    A local folder is recognised from its own `model_index.json` (as upstream does), so a
    renamed or fine-tuned copy works; an HF id must be one of the three Wan2.2 repos.
    """
    path = Path(model).expanduser()
    if path.is_dir():
        return family_of_folder(path)
    family = _BY_HF_ID.get(model.strip().lower())
    if family is None:
        ids = [f.hf_id for f in FAMILIES.values()]
        near = difflib.get_close_matches(model.strip().lower(), list(_BY_HF_ID), n=1, cutoff=0.6)
        as_path = model.startswith(("/", "./", "../", "~")) or "\\" in model or model.count("/") > 1
        why = (f"there is no folder at {path}" if as_path else
               "the launcher supports the three Wan2.2 Diffusers repos or a local folder holding one of them")
        raise LauncherError(
            f"Unknown model '{model}'", why,
            (f"did you mean {_BY_HF_ID[near[0]].hf_id}? " if near else "") + "use one of " + ", ".join(ids)
            + ", or the path of a local Wan2.2 *-Diffusers folder (it must contain model_index.json)",
            setting="model",
        )
    return family


def family_of_folder(path: Path) -> WanFamily:
    """The Wan2.2 family a Diffusers folder holds, from its model_index.json (as upstream reads it)."""
    index = path / "model_index.json"
    if not index.is_file():
        raise LauncherError(
            f"'{path}' is not a Diffusers model folder",
            "it has no model_index.json; vLLM-Omni loads only Diffusers-format Wan2.2 repos, "
            "not the original Wan-AI checkpoints",
            "download the *-Diffusers repo (e.g. Wan-AI/Wan2.2-TI2V-5B-Diffusers) into that folder",
            setting="model",
        )
    try:
        data = json.loads(index.read_text())
    except (OSError, ValueError) as exc:
        raise LauncherError(f"Cannot read {index}", str(exc), "re-download the model", setting="model") from exc
    cls = data.get("_class_name", "")
    if cls == "WanImageToVideoPipeline":
        return FAMILIES["i2v_a14b"]
    if cls == "WanPipeline":
        return FAMILIES["ti2v_5b"] if data.get("expand_timesteps") else FAMILIES["t2v_a14b"]
    raise LauncherError(
        f"'{path}' holds a {cls or 'unknown'} pipeline, not Wan2.2",
        "model_index.json names the pipeline class and vLLM-Omni picks its code from it",
        "use a Wan2.2 T2V-A14B, I2V-A14B or TI2V-5B Diffusers folder",
        setting="model",
    )


def nearest_frames(frames: int) -> int:
    """Nearest valid Wan frame count (4k+1), never below 1."""
    k = max(0, round((frames - 1) / 4))
    return 4 * k + 1


def check_request(family: WanFamily, *, width: int, height: int, frames: int, has_image: bool) -> None:
    """Refuse request shapes upstream would rewrite silently or fail late, naming the fix."""
    m = family.size_multiple
    for name, value in (("width", width), ("height", height)):
        if value % m or value <= 0:
            lower, upper = max(m, value // m * m), (value // m + 1) * m
            raise LauncherError(
                f"{name} {value} is not valid for {family.label}",
                f"it must be a multiple of {m} ({'VAE x16 and patch 2' if m == 32 else 'VAE x8 and patch 2'}); "
                "upstream would silently shrink it or fail the job",
                f"set {name} to {lower}" + (f" or {upper}" if upper != lower else ""),
                setting=name,
            )
    if frames < 1 or (frames - 1) % 4:
        raise LauncherError(
            f"frames {frames} is not valid for Wan2.2",
            "the frame count must be 4k+1 (Wan's VAE packs 4 frames per latent after the first)",
            f"set frames to {nearest_frames(frames)}",
            setting="frames",
        )
    if family.image_input == "required" and not has_image:
        raise LauncherError(
            f"{family.label} needs a start image",
            "it is an image-to-video model; upstream fails the job with 'No image is provided'",
            "connect an IMAGE to the 'image' input, or load T2V-A14B / TI2V-5B for text-only video",
            setting="image",
        )
    if family.image_input == "none" and has_image:
        raise LauncherError(
            f"{family.label} ignores images",
            "the T2V-A14B pipeline runs text-to-video only, so the image would be dropped silently",
            "disconnect the image, or load I2V-A14B or TI2V-5B for image-to-video",
            setting="image",
        )


# ----------------------------------------------------------------------------- local folders
@dataclass(frozen=True)
class LocalModel:
    """A Wan2.2 Diffusers folder found under one of ComfyUI's model folders."""

    label: str               # "local/<path relative to the model folder>", never an absolute path
    path: Path
    family: WanFamily


def find_local_models(roots: Iterable[Path], skipped: Optional[dict[str, str]] = None) -> dict[str, LocalModel]:
    """Every Wan2.2 Diffusers folder under `roots`, at any depth, keyed by its label.

    Walks like ComfyUI's own Diffusers loader (recursively, following links, labelled by
    relative path), so `models/diffusers/Wan-AI/Wan2.2-TI2V-5B-Diffusers`, the layout
    `huggingface-cli download --local-dir` makes, is found. A folder with model_index.json
    is a model and is not searched further; other pipelines (SDXL, ...) are skipped, and so
    are folders whose model_index.json cannot be read: `skipped`, when given, gets each
    such folder with why (the doctor lists them). The first root wins when two hold the
    same relative path.
    """
    found: dict[str, LocalModel] = {}
    for root in roots:
        visited: set[str] = set()
        for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
            real = os.path.realpath(dirpath)
            if real in visited:            # a link back up the tree
                dirnames[:] = []
                continue
            visited.add(real)
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            if "model_index.json" not in filenames:
                continue
            dirnames[:] = []
            folder = Path(dirpath)
            try:
                family = family_of_folder(folder)
            except LauncherError as exc:
                if skipped is not None:
                    skipped[str(folder)] = exc.what
                continue
            relative = folder.relative_to(root).as_posix()
            label = LOCAL_PREFIX + (relative if relative != "." else folder.name)
            found.setdefault(label, LocalModel(label, folder, family))
    return found


# ----------------------------------------------------------------------------- requests
def _check_number(name: str, value: object, whole: bool) -> None:
    """A request value must be None or a finite number (a whole one for `whole`): NaN, inf, text
    and lists would reach the server as "nan" or fail deep inside the launcher."""
    if value is None:
        return
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return
    if isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value) \
            and (not whole or float(value).is_integer()):
        return
    shown = f"the number {value}" if isinstance(value, float) else f"a value of type {type(value).__name__}"
    number = "a whole number" if whole else "a finite number"
    marker = "" if name == "seed" else (" (0 for the model's recommended value)" if whole or name == "fps" else
                                        " (-1 for the model's recommended value)")
    raise LauncherError(f"{name} is not valid: it is {shown}", f"{name} takes {number}",
                        f"set {name} to {number}{marker}", setting=name)


def request_for(family: WanFamily, *, prompt: str, negative_prompt: Optional[str] = None,
                width: Optional[int] = None, height: Optional[int] = None, frames: Optional[int] = None,
                fps: Optional[float] = None, steps: Optional[int] = None, guidance: Optional[float] = None,
                guidance_2: Optional[float] = None, boundary_ratio: Optional[float] = None,
                flow_shift: Optional[float] = None, seed: Optional[int] = None,
                image_png: Optional[bytes] = None) -> "VideoRequest":
    """The one place request defaults are filled in and checked (nodes and CLI).

    A value left out takes the model's recommended one: None, or the node widgets' markers
    (0 for width, height, frames, fps and steps; any negative number for guidance,
    guidance_2, boundary_ratio and flow_shift, where 0 is a real value). guidance_2 and
    boundary_ratio are sent only to the two-expert A14B models. Raises LauncherError,
    naming the setting and the nearest valid value, before anything reaches a server.
    """
    from .client.request import VideoRequest   # lazy: the server side imports models without the client

    for name, text in (("prompt", prompt), ("negative_prompt", negative_prompt)):
        if text is not None and not isinstance(text, str):
            raise LauncherError(f"The {name} is not text", f"it is a value of type {type(text).__name__}",
                                f"write the {name} as text", setting=name)
    if not (prompt or "").strip():
        raise LauncherError("The prompt is empty", "vLLM-Omni requires a prompt for Wan2.2",
                            "write a prompt", setting="prompt")
    for name, value, whole in (("width", width, True), ("height", height, True), ("frames", frames, True),
                               ("fps", fps, False), ("steps", steps, True), ("guidance", guidance, False),
                               ("guidance_2", guidance_2, False), ("boundary_ratio", boundary_ratio, False),
                               ("flow_shift", flow_shift, False), ("seed", seed, True)):
        _check_number(name, value, whole)

    def positive(value: Optional[float], default: float) -> float:
        return default if value is None or value <= 0 else value

    def given(value: Optional[float], default: float) -> float:
        return default if value is None or value < 0 else value

    width, height = positive(width, family.width), positive(height, family.height)
    frames = positive(frames, family.frames)
    check_request(family, width=width, height=height, frames=frames, has_image=image_png is not None)
    two = family.experts == 2
    return VideoRequest(
        prompt=prompt, negative_prompt=negative_prompt or None, width=width, height=height, num_frames=frames,
        fps=positive(fps, family.fps), steps=positive(steps, family.steps),
        guidance=given(guidance, family.guidance),
        guidance_2=given(guidance_2, family.guidance_2) if two else None,
        boundary_ratio=given(boundary_ratio, family.boundary_ratio) if two else None,
        flow_shift=given(flow_shift, family.flow_shift), seed=seed, image_png=image_png)
