"""The Wan model families the launcher serves, and how a model is identified: by HF id, by a
Diffusers folder's `model_index.json` (as upstream keys its pipeline), or by walking ComfyUI's
model folders for such folders.

Each family carries its shape (for the memory plan) and its upstream-recommended request
defaults. The rules a request must meet live in models/__init__.py, which re-exports these names so
`from ..models import FAMILIES` keeps working for every caller.
"""
from __future__ import annotations

import difflib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional

from ..errors import LauncherError

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
    # The pipelines beyond plain Wan2.2 (docs/wan-pipelines.md): "wan" (T2V / I2V / TI2V), "vace"
    # (control video or reference images), "s2v" (image + audio) or "dmd" (step-distilled: the
    # server runs its own fixed steps and guidance, so neither is sent).
    pipeline: str = "wan"
    min_version: tuple[int, int] = (0, 26)   # the first vLLM-Omni line whose registry serves it
    launch_flags: tuple[str, ...] = ()       # what `vllm serve` needs for this family (never a workflow's)
    # The vLLM-Omni lines on which the planner's memory estimate for this family was checked against a
    # real server's GPU peaks (planner/calibration.py says with what); a plan for another line says so.
    memory_measured_on: tuple[tuple[int, int], ...] = ((0, 26), (0, 30))
    # The rest of the DiT's shape (its transformer config.json), for the memory plan; the defaults are
    # the Wan 14B DiT's. `vace_blocks`: VACE's `vace_layers`, whose hints the forward holds all at once.
    head_dim: int = 128
    ffn_dim: int = 13824
    dit_in_channels: int = 16
    vace_blocks: int = 0
    # The DiT takes a timestep per token (TI2V-5B's `expand_timesteps`), so it holds a per-token
    # modulation the planner counts.
    expand_timesteps: bool = False
    # The repo's download (bf16 weights, as the README states), GB; 0 where the launcher states none.
    download_gb: int = 0


FAMILIES: dict[str, WanFamily] = {
    f.key: f
    for f in (
        WanFamily("t2v_a14b", "Wan2.2 T2V-A14B", "Wan-AI/Wan2.2-T2V-A14B-Diffusers", "WanPipeline",
                  40, 40, 14.29, 2, 16, 8, 16, "none",
                  832, 480, 81, 16.0, 40, 4.0, 3.0, 0.875, 12.0, download_gb=65),
        WanFamily("i2v_a14b", "Wan2.2 I2V-A14B", "Wan-AI/Wan2.2-I2V-A14B-Diffusers", "WanImageToVideoPipeline",
                  40, 40, 14.29, 2, 16, 8, 16, "required",
                  832, 480, 81, 16.0, 40, 3.5, 3.5, 0.9, 5.0, dit_in_channels=36),
        WanFamily("ti2v_5b", "Wan2.2 TI2V-5B", "Wan-AI/Wan2.2-TI2V-5B-Diffusers", "WanPipeline",
                  24, 30, 5.0, 1, 32, 16, 48, "optional",
                  1280, 704, 121, 24.0, 50, 5.0, 5.0, 0.875, 5.0,
                  ffn_dim=14336, dit_in_channels=48, expand_timesteps=True, download_gb=23),
    )
}

# The pipelines of issue #30, kept out of FAMILIES so every dropdown and preset built from the
# three base families stays as released. Shapes from each repo's transformer config; the
# defaults are the upstream pipeline's own (docs/wan-pipelines.md, sections 3-5). DiT parameters
# counted off the upstream classes at the real configs (bench/gpu/manifest_<family>.json): VACE-14B
# 17.34 B and VACE-1.3B 2.15 B with their VACE blocks, S2V 16.30 B (1260 tensors, as the released index).
PIPELINE_FAMILIES: dict[str, WanFamily] = {
    f.key: f
    for f in (
        WanFamily("vace_14b", "Wan2.1 VACE-14B", "Wan-AI/Wan2.1-VACE-14B-diffusers", "WanVACEPipeline",
                  40, 40, 17.34, 1, 16, 8, 16, "none",
                  832, 480, 81, 16.0, 50, 5.0, 5.0, 0.875, 3.0, pipeline="vace", memory_measured_on=((0, 30),),
                  vace_blocks=8),
        WanFamily("vace_1_3b", "Wan2.1 VACE-1.3B", "Wan-AI/Wan2.1-VACE-1.3B-diffusers", "WanVACEPipeline",
                  12, 30, 2.15, 1, 16, 8, 16, "none",
                  832, 480, 81, 16.0, 50, 5.0, 5.0, 0.875, 3.0, pipeline="vace", memory_measured_on=((0, 30),),
                  ffn_dim=8960, vace_blocks=15),
        WanFamily("s2v_14b", "Wan2.2 S2V-14B", "Wan-AI/Wan2.2-S2V-14B", "WanS2VPipeline",
                  40, 40, 16.30, 1, 16, 8, 16, "required",
                  832, 448, 80, 16.0, 40, 4.5, 4.5, 0.875, 3.0, pipeline="s2v",
                  launch_flags=("--model-class-name", "WanS2VPipeline"), memory_measured_on=((0, 30),)),
        WanFamily("fastwan_ti2v_5b", "FastWan2.2 TI2V-5B (3 steps)", "FastVideo/FastWan2.2-TI2V-5B-FullAttn-Diffusers",
                  "WanDMDPipeline", 24, 30, 5.0, 1, 32, 16, 48, "none",
                  1280, 704, 121, 24.0, 3, 1.0, 1.0, 0.875, 8.0, pipeline="dmd", min_version=(0, 30),
                  memory_measured_on=((0, 30),), ffn_dim=14336, dit_in_channels=48, expand_timesteps=True),
    )
}
ALL_FAMILIES: dict[str, WanFamily] = {**FAMILIES, **PIPELINE_FAMILIES}

_BY_HF_ID = {f.hf_id.lower(): f for f in ALL_FAMILIES.values()}


def family_for(model: str) -> WanFamily:
    """Identify the Wan2.2 family of an HF id or a local Diffusers folder.

    A local folder is recognised from its own `model_index.json` (as upstream does), so a
    renamed or fine-tuned copy works; an HF id must be one of the three Wan2.2 repos.
    """
    try:        # a server's /v1/models id comes here too: "~nobody/x" or a 5000-character name is no folder
        path = Path(model).expanduser()
        folder = path.is_dir()
    except (OSError, RuntimeError, ValueError):
        path, folder = Path(model), False
    if folder:
        return family_of_folder(path)
    family = _BY_HF_ID.get(model.strip().lower())
    if family is None:
        ids = [f.hf_id for f in ALL_FAMILIES.values()]
        base = [f.hf_id.lower() for f in FAMILIES.values()]      # the Wan2.2 repos first: the likelier typo
        near = (difflib.get_close_matches(model.strip().lower(), base, n=1, cutoff=0.6)
                or difflib.get_close_matches(model.strip().lower(), list(_BY_HF_ID), n=1, cutoff=0.6))
        as_path = model.startswith(("/", "./", "../", "~")) or "\\" in model or model.count("/") > 1
        why = (f"there is no folder at {path}" if as_path else
               "the launcher supports the Wan2.2 Diffusers repos, the VACE, S2V and FastWan repos "
               "(docs/wan-pipelines.md) or a local folder holding one of them")
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
    if not index.is_file() and is_s2v_original(path):
        return PIPELINE_FAMILIES["s2v_14b"]
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
    pipeline = _pipeline_family_of_folder(path, cls)
    if pipeline is not None:
        return pipeline
    raise LauncherError(
        f"'{path}' holds a {cls or 'unknown'} pipeline, not Wan2.2",
        "model_index.json names the pipeline class and vLLM-Omni picks its code from it",
        "use a Wan2.2 T2V-A14B, I2V-A14B or TI2V-5B Diffusers folder",
        setting="model",
    )


def is_s2v_original(path: Path) -> bool:
    """Wan2.2-S2V-14B ships in Wan's original layout, without model_index.json
    (pipeline_wan2_2_s2v.py:632-688): its audio encoder and VAE files identify it."""
    return (path / "wav2vec2-large-xlsr-53-english").is_dir() and (path / "Wan2.1_VAE.pth").is_file() \
        and (path / "config.json").is_file()


def _pipeline_family_of_folder(path: Path, cls: str) -> Optional[WanFamily]:
    """The issue-#30 family of a Diffusers folder, from its class and its transformer's shape."""
    try:
        config = json.loads((path / "transformer" / "config.json").read_text())
    except (OSError, ValueError):
        config = {}
    small, fastwan = PIPELINE_FAMILIES["vace_1_3b"], PIPELINE_FAMILIES["fastwan_ti2v_5b"]
    if cls == "WanVACEPipeline":
        return small if (config.get("num_layers"), config.get("num_attention_heads")) == (
            small.layers, small.attention_heads) else PIPELINE_FAMILIES["vace_14b"]
    if cls == "WanS2VPipeline":
        return PIPELINE_FAMILIES["s2v_14b"]
    if cls == fastwan.pipeline_class and config.get("in_channels") == fastwan.dit_in_channels:
        return fastwan
    if cls in ("WanDMDPipeline", "WanT2VDMD2Pipeline", "WanI2VDMD2Pipeline"):
        raise LauncherError(
            f"'{path}' holds a {cls} model the launcher has no shape for",
            "of the step-distilled Wan models only FastWan2.2 TI2V-5B is known to it (docs/wan-pipelines.md, "
            "section 5); the memory plan and the size rules need the model's shape",
            "use FastVideo/FastWan2.2-TI2V-5B-FullAttn-Diffusers", setting="model")
    return None


# ----------------------------------------------------------------------------- local folders
@dataclass(frozen=True)
class LocalModel:
    """A Wan2.2 Diffusers folder found under one of ComfyUI's model folders."""

    label: str               # "local/<path relative to the model folder>", never an absolute path
    path: Path
    family: WanFamily


def find_local_models(roots: Iterable[Path], skipped: Optional[dict[str, str]] = None,
                      pipelines: bool = False) -> dict[str, LocalModel]:
    """Every Wan2.2 Diffusers folder under `roots`, at any depth, keyed by its label.

    Walks like ComfyUI's own Diffusers loader (recursively, following links, labelled by
    relative path), so `models/diffusers/Wan-AI/Wan2.2-TI2V-5B-Diffusers`, the layout
    `huggingface-cli download --local-dir` makes, is found. A folder with model_index.json
    is a model and is not searched further; other pipelines (SDXL, ...) are skipped, and so
    are folders whose model_index.json cannot be read: `skipped`, when given, gets each
    such folder with why (the doctor lists them). The first root wins when two hold the
    same relative path. VACE / S2V / FastWan folders (PIPELINE_FAMILIES) count only with
    `pipelines`: Load Model and its handles know the three base families alone.
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
            if "model_index.json" not in filenames and not (pipelines and is_s2v_original(Path(dirpath))):
                continue
            dirnames[:] = []
            folder = Path(dirpath)
            try:
                family = family_of_folder(folder)
            except LauncherError as exc:
                if skipped is not None:
                    skipped[str(folder)] = exc.what
                continue
            if family.key in PIPELINE_FAMILIES and not pipelines:
                if skipped is not None:
                    skipped[str(folder)] = f"a {family.label} model: not one of Load Model's Wan2.2 families"
                continue
            relative = folder.relative_to(root).as_posix()
            label = LOCAL_PREFIX + (relative if relative != "." else folder.name)
            found.setdefault(label, LocalModel(label, folder, family))
    return found
