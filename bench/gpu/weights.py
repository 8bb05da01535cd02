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

A family with distill LoRAs (T2V-A14B) also gets its random LoRA file (lora_weights.py).
"""
from __future__ import annotations

import base64
import json
import math
import os
import time
from pathlib import Path
from typing import Any, Iterable, Optional

from .families import GIB, MARGIN, SHM, TI2V_5B, Family, placement
from .lora_weights import LORA_STD, lora_tensors

SHARD_BYTES = 5 * 10 ** 9                  # save_pretrained's max_shard_size="5GB"
DTYPE_BYTES = {"bf16": 2, "fp32": 4, "u8": 1, "f8": 1}
UMT5_SIZES = dict(vocab_size=256384, d_model=4096, d_kv=64, d_ff=10240, num_layers=24, num_decoder_layers=24,
                  num_heads=64)
# The TI2V-5B names of the first run (tests and old command lines read them here).
MANIFEST, COMFY_FILES, DIFFUSERS_FOLDER = TI2V_5B.manifest, TI2V_5B.files, TI2V_5B.diffusers_folder
SMALL_FILES = ("model_index.json", "scheduler/scheduler_config.json", "tokenizer/special_tokens_map.json",
               "tokenizer/spiece.model", "tokenizer/tokenizer.json", "tokenizer/tokenizer_config.json")
FP8_MARKER = "scaled_fp8"       # ComfyUI's scaled-fp8 marker key (comfy/model_detection.py)


def _dtype_name(dtype: Any) -> str:
    return {"torch.bfloat16": "bf16", "torch.float32": "fp32", "torch.uint8": "u8",
            "torch.float8_e4m3fn": "f8"}[str(dtype)]


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


def manifest_diffusers(tiny: Path, full_size: bool = True, fam: Family = TI2V_5B) -> dict:
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
                                            for k, v in fam.transformer.items()}) if full_size else \
        dict(config("transformer"), text_dim=TINY_UMT5["d_model"])
    vae_cfg = dict(config("vae"), **fam.vae_full) if full_size else config("vae")

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


def manifest_comfy(comfy_dir: Path, full_size: bool = True, fam: Family = TI2V_5B) -> dict:
    """The ComfyUI side (ComfyUI's python, its source on sys.path): ComfyUI's own classes on the meta device;
    a scaled-fp8 family's diffusion model through ComfyUI's scaled-fp8 operations (its Linear weights fp8
    with their `scale_weight`), plus the marker ComfyUI's own save writes."""
    import sys

    import torch

    sys.path.insert(0, str(comfy_dir))
    sys.argv = [sys.argv[0], "--cpu"]
    import comfy.options

    comfy.options.enable_args_parsing()
    import importlib

    import comfy.ldm.wan.model
    import comfy.ops
    import comfy.text_encoders.t5

    ops = comfy.ops.disable_weight_init
    # scale_input too: what ComfyUI's own save of an empty-marker model holds (its loader expects it)
    unet_ops = comfy.ops.scaled_fp8_ops(scale_input=True, override_dtype=torch.float8_e4m3fn) if fam.scaled_fp8 \
        else ops
    unet = comfy.ldm.wan.model.WanModel(**(fam.comfy_unet if full_size else fam.comfy_unet_tiny), device="meta",
                                        dtype=torch.bfloat16, operations=unet_ops)
    t5cfg = json.loads((comfy_dir / "comfy/text_encoders/umt5_config_xxl.json").read_text())
    if not full_size:
        t5cfg.update(TINY_UMT5)
    te = comfy.text_encoders.t5.T5(t5cfg, torch.bfloat16, "meta", ops)
    module, vae_kwargs = fam.comfy_vae
    with torch.device("meta"):
        vae = importlib.import_module(f"comfy.ldm.wan.{module}").WanVAE(**vae_kwargs)
    unet_tensors = _tensors(unet.state_dict())
    if fam.scaled_fp8:      # fp8 weights only: scale_weight float32, biases bf16 (ComfyUI casts them to the
        # compute dtype on use); the marker's length is set at build
        scaled = {k.removesuffix("scale_weight") for k, _, _ in unet_tensors if k.endswith(".scale_weight")}
        unet_tensors = [[k, s, "fp32" if k.endswith((".scale_weight", ".scale_input")) else
                         "bf16" if k.endswith(".bias") and k.removesuffix("bias") in scaled else d]
                        for k, s, d in unet_tensors]
        unet_tensors.append([FP8_MARKER, [0], "f8"])
    return {"unet": unet_tensors, "te": _tensors(te.state_dict(), dtype="bf16"),
            "vae": _tensors(vae.state_dict(), dtype="bf16")}


def write_manifest(side: str, source: Path, out: Path, full_size: bool = True, fam: Family = TI2V_5B) -> dict:
    """Add one side to the manifest file (the other side, if there, is kept)."""
    doc = json.loads(out.read_text()) if out.is_file() else {}
    doc[side] = (manifest_diffusers(source, full_size, fam) if side == "diffusers"
                 else manifest_comfy(source, full_size, fam))
    doc["family"] = fam.name
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
    N(0, 1/fan_in) so activations stay O(1) through 30-40 layers (no inf/NaN in bf16); a LoRA's
    down/up matrices N(0, LORA_STD)."""
    leaf = name.rsplit(".", 1)[-1]
    if ".lora_" in name:
        return "normal", LORA_STD
    if leaf == "scale_input":       # scaled fp8: activations stay O(1), so no input scaling
        return "ones", 0.0
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
    """Seeded random tensors, made on the GPU when there is one (5 B values in a second, not a minute).
    Scaled fp8 (ComfyUI's layout): the fp8 weight holds N(0, 1) and its `scale_weight` the std `init_kind`
    gives the weight, so weight * scale_weight is the same distribution as a bf16 file's."""

    def __init__(self, seed: int) -> None:
        import torch

        self.torch = torch
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        self.gen = torch.Generator(device=self.device).manual_seed(seed)

    def make(self, name: str, shape: list[int], dtype: str, shapes: Optional[dict] = None) -> Any:
        t = self.torch
        tdtype = {"bf16": t.bfloat16, "fp32": t.float32, "u8": t.uint8, "f8": t.float8_e4m3fn}[dtype]
        if name.endswith(".scale_weight") and shapes is not None:
            weight = name.removesuffix("scale_weight") + "weight"
            return t.full(shape, init_kind(weight, shapes[weight])[1], dtype=tdtype)
        if name.endswith(".alpha") and shapes is not None:     # a LoRA's alpha = its rank (scale alpha/rank 1)
            return t.full(shape, float(shapes[name.removesuffix("alpha") + "lora_down.weight"][0]), dtype=tdtype)
        kind, std = init_kind(name, shape)
        if kind == "ones":
            x = t.ones(shape, dtype=tdtype)
        elif kind == "zeros" or name == FP8_MARKER:
            x = t.zeros(shape, dtype=tdtype)
        else:
            x = t.randn(shape, generator=self.gen, device=self.device, dtype=t.float32)
            x = (x.clamp_(-448.0, 448.0) if dtype == "f8" else x * std).to(tdtype).cpu()
        return x.contiguous()


def _save(tensors: dict, path: Path, metadata: Optional[dict] = None) -> None:
    from safetensors.torch import save_file

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".part")
    save_file(tensors, str(tmp), metadata=metadata or {"format": "pt"})
    os.replace(tmp, path)


def _write_file(filler: Filler, tensors: list, path: Path, extra: Optional[dict] = None) -> int:
    shapes = {k: s for k, s, _ in tensors}
    data = {k: filler.make(k, s, d, shapes) for k, s, d in tensors}
    data.update(extra or {})
    _save(data, path)
    return sum(v.numel() * v.element_size() for v in data.values())


def _write_sharded(filler: Filler, tensors: list, folder: Path, stem: str, limit: int,
                   groups: Optional[list] = None) -> int:
    """save_pretrained's layout: one file, or N shards plus `<stem>.safetensors.index.json` (`groups`: the
    shards as given, e.g. a repo's own count, instead of `limit` bytes each)."""
    groups = groups or shard(tensors, limit)
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


def disk_plan(manifest: dict, fam: Family, base: Path, shm: Path, reserve: int = 0) -> dict:
    """What `build` writes where, against the free space of each filesystem (hard links and the
    second expert count once); `reserve` bytes of the disk stay free for what arrives later (the kit)."""
    import shutil

    d, c = manifest["diffusers"], manifest["comfy"]
    sizes = {"unet": nbytes(c["unet"]), "te": nbytes(c["te"]), "vae": nbytes(c["vae"]),
             "transformer": nbytes(d["transformer"]["tensors"]), "diffusers_vae": nbytes(d["vae"]["tensors"])}
    if fam.loras:
        sizes["loras"] = nbytes(lora_tensors(c["unet"]))    # one file, the other name a hard link
    plan = placement(fam, sizes)
    base.mkdir(parents=True, exist_ok=True)
    plan["disk_free_bytes"] = shutil.disk_usage(base).free
    plan["shm_free_bytes"] = shutil.disk_usage(shm).free if fam.shm else None
    plan["gib"] = {k: round(v / GIB, 2) for k, v in sizes.items()}
    short = []
    if plan["disk_bytes"] + MARGIN + reserve > plan["disk_free_bytes"]:
        short.append(f"{base}: needs {plan['disk_bytes'] / GIB:.1f} GiB + {MARGIN / GIB:.0f} GiB margin + "
                     f"{reserve / GIB:.0f} GiB kept for the kit and venvs, "
                     f"{plan['disk_free_bytes'] / GIB:.1f} GiB free")
    if fam.shm and plan["shm_bytes"] + MARGIN > plan["shm_free_bytes"]:
        short.append(f"{shm}: needs {plan['shm_bytes'] / GIB:.1f} GiB + {MARGIN / GIB:.0f} GiB margin, "
                     f"{plan['shm_free_bytes'] / GIB:.1f} GiB free")
    plan["short"] = short
    return plan


def _place(path: Path, names: tuple[str, ...], into: Path) -> None:
    """`path` also under each of `names` (hard links beside it), and every name visible in `into`
    (symbolic links where `path` lives elsewhere, e.g. /dev/shm)."""
    for name in names:
        alias = path.with_name(name)
        if alias.exists():
            alias.unlink()
        os.link(path, alias)
    if path.parent.resolve() != into.resolve():
        into.mkdir(parents=True, exist_ok=True)
        for name in (path.name, *names):
            link = into / name
            if link.is_symlink() or link.exists():
                link.unlink()
            link.symlink_to(path.with_name(name))


def build(manifest: dict, base: Path, seed: int = 0, shard_bytes: int = SHARD_BYTES, log: Any = print,
          fam: Family = TI2V_5B, shm: Path = SHM, fp8_marker_elements: int = 0, reserve: int = 0) -> dict:
    """Write `base/models/{diffusion_models,text_encoders,vae,loras}/...` (ComfyUI) and
    `base/models/diffusers/<family folder>/` (ours), the text encoder once (hard link); the family's `shm`
    files under `shm` (linked into models/). Stops before writing anything when a filesystem lacks room."""
    import torch

    plan = disk_plan(manifest, fam, base, shm, reserve)
    log("weights: plan " + json.dumps({k: v for k, v in plan.items() if k != "short"}))
    if plan["short"]:
        raise SystemExit("weights: not enough room, nothing written: " + "; ".join(plan["short"]) +
                         ". Free space there (an earlier family's weights under models/), or place files "
                         "elsewhere (--shm DIR)")
    t0 = time.monotonic()
    filler = Filler(seed)
    models = base / "models"
    d, c = manifest["diffusers"], manifest["comfy"]
    out = models / "diffusers" / fam.diffusers_folder
    report: dict[str, Any] = {"family": fam.name, "device": filler.device, "files": {}, "plan": plan["gib"],
                              "disk_free_gib_before": round(plan["disk_free_bytes"] / GIB, 1)}

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
    te_path = fam.comfy_path(models, "te")
    size = _write_file(filler, c["te"], te_path,
                       {"spiece_model": torch.frombuffer(bytearray(spiece), dtype=torch.uint8).clone()})
    done("comfy text encoder (shared)", size)
    link = out / "text_encoder" / "model.safetensors"
    if link.exists():
        link.unlink()
    os.link(te_path, link)
    for key in ("unet", "vae"):
        tensors = [[k, [fp8_marker_elements] if k == FP8_MARKER else s, dt] for k, s, dt in c[key]]
        sub, name = fam.files[key]
        place = shm / "vllm-omni-bench" / sub if key in fam.shm else models / sub
        done(f"comfy {key}{' (in ' + str(place) + ')' if key in fam.shm else ''}",
             _write_file(filler, tensors, place / name))
        _place(place / name, fam.unet_aliases if key == "unet" else (), models / sub)
    if fam.loras:       # one random LoRA file under every expert's name (hard links)
        first = models / "loras" / fam.loras[0]
        done(f"comfy LoRA {', '.join(fam.loras)}", _write_file(filler, lora_tensors(c["unet"]), first))
        _place(first, fam.loras[1:], first.parent)
    done("diffusers transformer", _write_sharded(filler, d["transformer"]["tensors"], out / "transformer",
                                                 "diffusion_pytorch_model", shard_bytes))
    if fam.experts == 2:    # the second expert: the same files again, hard-linked (one copy on disk)
        second = out / "transformer_2"
        second.mkdir(parents=True, exist_ok=True)
        for f in (out / "transformer").iterdir():
            if (second / f.name).exists():
                (second / f.name).unlink()
            os.link(f, second / f.name)
        log("weights: transformer_2 hard-links transformer")
    done("diffusers vae", _write_sharded(filler, d["vae"]["tensors"], out / "vae", "diffusion_pytorch_model",
                                         shard_bytes))
    (out / ".built").write_text(json.dumps(report))
    report["seconds"] = round(time.monotonic() - t0, 1)
    return report
