"""Real-size random weights for both sides of the head-to-head: our Diffusers folder and ComfyUI's single files.

The manifest (``python -m bench.gpu manifest``, run here on CPU, committed as ``manifest_ti2v5b.json``) lists
every tensor's name, shape and dtype, read off the upstream classes on the meta device:

* the Diffusers side from diffusers' ``WanTransformer3DModel`` / ``AutoencoderKLWan`` and transformers'
  ``UMT5EncoderModel`` at TI2V-5B sizes (run under the server venv), the tensor names as the tiny kit
  folder's ``save_pretrained`` files have them (tied embeddings saved once);
* the ComfyUI side from ComfyUI's own classes: ``comfy.ldm.wan.model.WanModel`` with the config ComfyUI's
  ``model_detection`` derives for Wan2.2 TI2V-5B, ``comfy.text_encoders.t5.T5`` with ComfyUI's
  ``umt5_config_xxl.json``, ``comfy.ldm.wan.vae2_2.WanVAE`` as ``comfy.sd.VAE`` builds it (run under
  ComfyUI's python).

The UMT5 tensor names and shapes are the same on both sides, so one text-encoder file (with ComfyUI's
embedded ``spiece_model`` tokenizer tensor, which transformers ignores) serves both: the same weights, and
11 GiB less disk. ``build`` (on the device, image python: torch + safetensors only, so it can run before
the kit is installed) fills every tensor with seeded random values and writes both layouts; ``detect``
(ComfyUI's python) asks ComfyUI what each single file is. Random weights: speed and memory, never quality.
"""
from __future__ import annotations

import base64
import json
import math
import os
import time
from pathlib import Path
from typing import Any, Iterable, Optional

GIB = 1 << 30
MANIFEST = Path(__file__).with_name("manifest_ti2v5b.json")
SHARD_BYTES = 5 * 10 ** 9                  # save_pretrained's max_shard_size="5GB"
DTYPE_BYTES = {"bf16": 2, "fp32": 4, "u8": 1}
# TI2V-5B sizes (Wan-AI/Wan2.2-TI2V-5B-Diffusers configs; the gpu kit's make_fullsize_ti2v.py uses the same).
DIFFUSERS_TRANSFORMER = dict(patch_size=(1, 2, 2), num_attention_heads=24, attention_head_dim=128, in_channels=48,
                             out_channels=48, text_dim=4096, freq_dim=256, ffn_dim=14336, num_layers=30,
                             cross_attn_norm=True, qk_norm="rms_norm_across_heads", eps=1e-6, image_dim=None,
                             added_kv_proj_dim=None, rope_max_seq_len=1024, pos_embed_seq_len=None)
UMT5_SIZES = dict(vocab_size=256384, d_model=4096, d_kv=64, d_ff=10240, num_layers=24, num_decoder_layers=24,
                  num_heads=64)
# What ComfyUI's model_detection derives from a Wan2.2 TI2V-5B file (head.modulation dim 3072, out 48).
COMFY_WAN22_5B = dict(model_type="t2v", patch_size=(1, 2, 2), text_len=512, in_dim=48, dim=3072, ffn_dim=14336,
                      freq_dim=256, text_dim=4096, out_dim=48, num_heads=24, num_layers=30, window_size=(-1, -1),
                      qk_norm=True, cross_attn_norm=True, eps=1e-6, image_model="wan2.1")
COMFY_WAN22_VAE = dict(dim=160, z_dim=48, dim_mult=[1, 2, 4, 4], num_res_blocks=2, attn_scales=[],
                       temperal_downsample=[False, True, True], dropout=0.0)
# File names under ComfyUI's model folders (what the native workflow's loaders name).
COMFY_FILES = {"unet": ("diffusion_models", "wan2.2_ti2v_5B_random_bf16.safetensors"),
               "te": ("text_encoders", "umt5_xxl_random_bf16.safetensors"),
               "vae": ("vae", "wan2.2_vae_random.safetensors")}
DIFFUSERS_FOLDER = "ti2v-5b-fullsize"
SMALL_FILES = ("model_index.json", "scheduler/scheduler_config.json", "tokenizer/special_tokens_map.json",
               "tokenizer/spiece.model", "tokenizer/tokenizer.json", "tokenizer/tokenizer_config.json")


def _dtype_name(dtype: Any) -> str:
    return {"torch.bfloat16": "bf16", "torch.float32": "fp32", "torch.uint8": "u8"}[str(dtype)]


def _tensors(state_dict: dict, names: Optional[Iterable[str]] = None, dtype: Optional[str] = None) -> list:
    keys = list(state_dict) if names is None else list(names)
    missing = [k for k in keys if k not in state_dict]
    if missing:
        raise KeyError(f"saved names the class does not have: {missing[:5]}")
    return [[k, list(state_dict[k].shape), dtype or _dtype_name(state_dict[k].dtype)] for k in keys]


def _saved_names(path: Path) -> list[str]:
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        return sorted(f.keys())


# ----------------------------------------------------------------------------- manifests (CPU, here)
def _saved_tensors(full: Any, tiny: Any, tiny_file: Path, dtype: str) -> list:
    """`full`'s tensors as save_pretrained writes them: what it leaves out (tied weights) is read off the
    tiny kit model of the same class (its meta state dict against the names in its saved file)."""
    saved = set(_saved_names(tiny_file))
    dropped = {k for k in tiny.state_dict() if k not in saved}
    extra = saved - set(tiny.state_dict())
    if extra:
        raise KeyError(f"{tiny_file}: saved names the class does not have: {sorted(extra)[:5]}")
    return _tensors(full.state_dict(), [k for k in full.state_dict() if k not in dropped], dtype)


def manifest_diffusers(tiny: Path, full_size: bool = True) -> dict:
    """The Diffusers side (server venv: diffusers + transformers): configs, tensors, the kit's small files.
    `full_size=False`: the tiny kit model's own sizes (the CPU rehearsal)."""
    import torch
    from diffusers import AutoencoderKLWan, WanTransformer3DModel
    from transformers import UMT5Config, UMT5EncoderModel

    def config(rel: str) -> dict:
        return json.loads((tiny / rel / "config.json").read_text())

    def plain(cfg: dict) -> dict:
        return {k: v for k, v in cfg.items() if not k.startswith("_")}

    tr_cfg = dict(config("transformer"), **{k: list(v) if isinstance(v, tuple) else v
                                            for k, v in DIFFUSERS_TRANSFORMER.items()}) if full_size else \
        dict(config("transformer"), text_dim=TINY_UMT5["d_model"])
    vae_cfg = dict(config("vae"), base_dim=160, decoder_base_dim=256) if full_size else config("vae")

    def umt5(cfg: dict, sizes: dict) -> Any:
        cfg = {k: v for k, v in cfg.items() if k not in ("architectures", "transformers_version", "dtype")}
        c = UMT5Config(**dict(cfg, **sizes))
        c.architectures = ["UMT5EncoderModel"]
        return c

    te_full = umt5(config("text_encoder"), UMT5_SIZES if full_size else TINY_UMT5)
    with torch.device("meta"):
        models = {"transformer": (WanTransformer3DModel(**plain(tr_cfg)),
                                  WanTransformer3DModel(**plain(config("transformer")))),
                  "vae": (AutoencoderKLWan(**plain(vae_cfg)), AutoencoderKLWan(**plain(config("vae")))),
                  "text_encoder": (UMT5EncoderModel(te_full), UMT5EncoderModel(umt5(config("text_encoder"), {})))}
    te_cfg = dict(te_full.to_dict(), dtype="bfloat16")
    saved = {"transformer": "diffusion_pytorch_model.safetensors", "vae": "diffusion_pytorch_model.safetensors",
             "text_encoder": "model.safetensors"}
    dtypes = {"transformer": "bf16", "vae": "fp32", "text_encoder": "bf16"}   # as make_fullsize_ti2v saves them
    doc: dict[str, Any] = {"files": {rel: {"b64": base64.b64encode((tiny / rel).read_bytes()).decode()}
                                     for rel in SMALL_FILES}}
    for comp, cfg in (("transformer", tr_cfg), ("vae", vae_cfg), ("text_encoder", te_cfg)):
        full, small = models[comp]
        doc[comp] = {"config": cfg, "tensors": _saved_tensors(full, small, tiny / comp / saved[comp], dtypes[comp])}
    return doc


# The CPU rehearsal's sizes: a 2-layer Wan2.2-5B-shaped DiT (ComfyUI derives its sizes from the file) and a
# 24-layer UMT5 of width 4096 but almost no attention/FFN width (ComfyUI tells UMT5-XXL by block 23's FFN
# input width; the rehearsal's copy of ComfyUI carries these sizes as its umt5_config_xxl.json). ComfyUI
# builds the VAE at fixed sizes, so it stays full size.
TINY_UMT5 = dict(d_ff=64, d_kv=1, d_model=4096, num_heads=2, num_layers=24, num_decoder_layers=24, vocab_size=256)
TINY_WAN22_5B = dict(COMFY_WAN22_5B, dim=128, ffn_dim=256, num_heads=1, num_layers=2)


def manifest_comfy(comfy_dir: Path, full_size: bool = True) -> dict:
    """The ComfyUI side (ComfyUI's python, its source on sys.path): ComfyUI's own classes on the meta device."""
    import sys

    import torch

    sys.path.insert(0, str(comfy_dir))
    sys.argv = [sys.argv[0], "--cpu"]
    import comfy.options

    comfy.options.enable_args_parsing()
    import comfy.ldm.wan.model
    import comfy.ldm.wan.vae2_2
    import comfy.ops
    import comfy.text_encoders.t5

    ops = comfy.ops.disable_weight_init
    unet = comfy.ldm.wan.model.WanModel(**(COMFY_WAN22_5B if full_size else TINY_WAN22_5B), device="meta",
                                        dtype=torch.bfloat16, operations=ops)
    t5cfg = json.loads((comfy_dir / "comfy/text_encoders/umt5_config_xxl.json").read_text())
    if not full_size:
        t5cfg.update(TINY_UMT5)
    te = comfy.text_encoders.t5.T5(t5cfg, torch.bfloat16, "meta", ops)
    with torch.device("meta"):
        vae = comfy.ldm.wan.vae2_2.WanVAE(**COMFY_WAN22_VAE)
    return {"unet": _tensors(unet.state_dict()), "te": _tensors(te.state_dict(), dtype="bf16"),
            "vae": _tensors(vae.state_dict(), dtype="bf16")}


def write_manifest(side: str, source: Path, out: Path, full_size: bool = True) -> dict:
    """Add one side to the manifest file (the other side, if there, is kept)."""
    doc = json.loads(out.read_text()) if out.is_file() else {}
    doc[side] = manifest_diffusers(source, full_size) if side == "diffusers" else manifest_comfy(source, full_size)
    if "diffusers" in doc and "comfy" in doc:
        check_shared_text_encoder(doc)
    out.write_text(json.dumps(doc, separators=(",", ":")))
    return doc


def check_shared_text_encoder(doc: dict) -> None:
    """The one UMT5 file serves both sides only if both name and shape every tensor alike."""
    ours = {k: s for k, s, _ in doc["diffusers"]["text_encoder"]["tensors"]}
    theirs = {k: s for k, s, _ in doc["comfy"]["te"]}
    if ours != theirs:
        diff = sorted(k for k in set(ours) | set(theirs) if ours.get(k) != theirs.get(k))
        raise ValueError(f"UMT5 tensors differ between Diffusers and ComfyUI: {diff[:5]}")


# ----------------------------------------------------------------------------- filling (device)
def init_kind(name: str, shape: list[int]) -> tuple[str, float]:
    """How a tensor is filled: ("ones"|"zeros"|"normal", std). Norm scales 1, biases 0, the rest
    N(0, 1/fan_in) so activations stay O(1) through 30-40 layers (no inf/NaN in bf16)."""
    leaf = name.rsplit(".", 1)[-1]
    is_norm = "norm" in name.lower() and leaf in ("weight", "gamma", "scale")
    if is_norm or leaf == "gamma":
        return "ones", 0.0
    if leaf in ("bias", "beta"):
        return "zeros", 0.0
    fan_in = math.prod(shape[1:]) if len(shape) > 1 else (shape[0] if shape else 1)
    if "modulation" in name or "scale_shift_table" in name or name == "shared.weight":
        fan_in = shape[-1] if shape else 1      # added to / looked up, not multiplied through
    return "normal", 1.0 / math.sqrt(max(1, fan_in))


def nbytes(tensors: list) -> int:
    return sum(math.prod(s) * DTYPE_BYTES[d] for _, s, d in tensors)


def shard(tensors: list, limit: int = SHARD_BYTES) -> list[list]:
    """Consecutive groups of at most `limit` bytes (a bigger tensor gets a group of its own)."""
    groups: list[list] = [[]]
    size = 0
    for t in tensors:
        b = nbytes([t])
        if groups[-1] and size + b > limit:
            groups.append([])
            size = 0
        groups[-1].append(t)
        size += b
    return groups


class Filler:
    """Seeded random tensors, made on the GPU when there is one (5 B values in a second, not a minute)."""

    def __init__(self, seed: int) -> None:
        import torch

        self.torch = torch
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        self.gen = torch.Generator(device=self.device).manual_seed(seed)

    def make(self, name: str, shape: list[int], dtype: str) -> Any:
        t = self.torch
        tdtype = {"bf16": t.bfloat16, "fp32": t.float32, "u8": t.uint8}[dtype]
        kind, std = init_kind(name, shape)
        if kind == "ones":
            x = t.ones(shape, dtype=tdtype)
        elif kind == "zeros":
            x = t.zeros(shape, dtype=tdtype)
        else:
            x = (t.randn(shape, generator=self.gen, device=self.device, dtype=t.float32) * std).to(tdtype).cpu()
        return x.contiguous()


def _save(tensors: dict, path: Path, metadata: Optional[dict] = None) -> None:
    from safetensors.torch import save_file

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".part")
    save_file(tensors, str(tmp), metadata=metadata or {"format": "pt"})
    os.replace(tmp, path)


def _write_file(filler: Filler, tensors: list, path: Path, extra: Optional[dict] = None) -> int:
    data = {k: filler.make(k, s, d) for k, s, d in tensors}
    data.update(extra or {})
    _save(data, path)
    return sum(v.numel() * v.element_size() for v in data.values())


def _write_sharded(filler: Filler, tensors: list, folder: Path, stem: str, limit: int) -> int:
    """save_pretrained's layout: one file, or N shards plus `<stem>.safetensors.index.json`."""
    groups = shard(tensors, limit)
    if len(groups) == 1:
        return _write_file(filler, tensors, folder / f"{stem}.safetensors")
    weight_map, total = {}, 0
    for i, group in enumerate(groups, 1):
        name = f"{stem}-{i:05d}-of-{len(groups):05d}.safetensors"
        total += _write_file(filler, group, folder / name)
        weight_map.update({k: name for k, _, _ in group})
    (folder / f"{stem}.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1))
    return total


def build(manifest: dict, base: Path, seed: int = 0, shard_bytes: int = SHARD_BYTES,
          log: Any = print) -> dict:
    """Write `base/models/{diffusion_models,text_encoders,vae}/...` (ComfyUI) and
    `base/models/diffusers/<DIFFUSERS_FOLDER>/` (ours), the text encoder once (hard link)."""
    import torch

    t0 = time.monotonic()
    filler = Filler(seed)
    models = base / "models"
    d, c = manifest["diffusers"], manifest["comfy"]
    out = models / "diffusers" / DIFFUSERS_FOLDER
    report: dict[str, Any] = {"device": filler.device, "files": {}}

    def done(what: str, size: int) -> None:
        report["files"][what] = round(size / GIB, 3)
        log(f"weights: {what} {size / GIB:.2f} GiB at {time.monotonic() - t0:.0f}s")

    for rel, spec in d["files"].items():
        path = out / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(spec["b64"]))
    for comp in ("transformer", "vae", "text_encoder"):
        (out / comp).mkdir(parents=True, exist_ok=True)
        (out / comp / "config.json").write_text(json.dumps(d[comp]["config"], indent=1))
    spiece = (out / "tokenizer/spiece.model").read_bytes()
    te_dir, te_name = COMFY_FILES["te"]
    te_path = models / te_dir / te_name
    size = _write_file(filler, c["te"], te_path,
                       {"spiece_model": torch.frombuffer(bytearray(spiece), dtype=torch.uint8).clone()})
    done("comfy text encoder (shared)", size)
    link = out / "text_encoder" / "model.safetensors"
    if link.exists():
        link.unlink()
    os.link(te_path, link)
    for key in ("unet", "vae"):
        sub, name = COMFY_FILES[key]
        done(f"comfy {key}", _write_file(filler, c[key], models / sub / name))
    done("diffusers transformer", _write_sharded(filler, d["transformer"]["tensors"], out / "transformer",
                                                 "diffusion_pytorch_model", shard_bytes))
    done("diffusers vae", _write_sharded(filler, d["vae"]["tensors"], out / "vae", "diffusion_pytorch_model",
                                         shard_bytes))
    (out / ".built").write_text(json.dumps(report))
    report["seconds"] = round(time.monotonic() - t0, 1)
    return report


# ----------------------------------------------------------------------------- detection (ComfyUI's python)
def _meta_state_dict(path: Path) -> dict:
    """Tensor names and shapes of a safetensors file as meta tensors (no data read)."""
    import torch
    from safetensors import safe_open

    dtypes = {"BF16": torch.bfloat16, "F32": torch.float32, "F16": torch.float16, "U8": torch.uint8}
    out = {}
    with safe_open(str(path), "pt") as f:
        for k in f.keys():
            sl = f.get_slice(k)
            out[k] = torch.empty(sl.get_shape(), dtype=dtypes.get(sl.get_dtype(), torch.float32), device="meta")
    return out


def detect(base: Path, comfy_dir: Path, cpu: bool = False) -> dict:
    """What ComfyUI makes of each single file: the model class model_detection picks for the diffusion
    model, the text-encoder type and dtype for the UMT5 file, the VAE kind comfy.sd.VAE's rules pick."""
    import sys

    sys.path.insert(0, str(comfy_dir))
    sys.argv = [sys.argv[0], *(["--cpu"] if cpu else [])]   # ComfyUI parses its own flags on import
    import comfy.options

    comfy.options.enable_args_parsing()
    import comfy.model_detection
    import comfy.sd
    import comfy.text_encoders.sd3_clip

    models = base / "models"
    result: dict[str, Any] = {}
    unet = _meta_state_dict(models.joinpath(*COMFY_FILES["unet"]))
    cfg = comfy.model_detection.model_config_from_unet(unet, "")
    result["unet"] = {"class": type(cfg).__name__ if cfg else None,
                      "unet_config": {k: v for k, v in (cfg.unet_config if cfg else {}).items()
                                      if isinstance(v, (int, float, str, bool))},
                      "latent_channels": getattr(getattr(cfg, "latent_format", None), "latent_channels", None)}
    te = _meta_state_dict(models.joinpath(*COMFY_FILES["te"]))
    result["te"] = {"model": str(comfy.sd.detect_te_model(te)),
                    "t5_detect": {k: str(v) for k, v in comfy.text_encoders.sd3_clip.t5_xxl_detect(te).items()},
                    "spiece_model": "spiece_model" in te}
    import comfy.utils

    vae = comfy.sd.VAE(sd=comfy.utils.load_torch_file(str(models.joinpath(*COMFY_FILES["vae"]))))
    result["vae"] = {"class": f"{type(vae.first_stage_model).__module__}.{type(vae.first_stage_model).__name__}",
                     "latent_channels": vae.latent_channels}
    result["ok"] = (result["unet"]["class"] == "WAN22_T2V" and result["te"]["model"].endswith("T5_XXL")
                    and result["vae"]["class"].startswith("comfy.ldm.wan.vae2_2") and vae.latent_channels == 48)
    return result
