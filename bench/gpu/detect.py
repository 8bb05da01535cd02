"""What ComfyUI makes of each single file `weights` wrote (ComfyUI's python, its source on sys.path): the
model class model_detection picks for the diffusion model (and, for a scaled-fp8 file, the fp8 flavour and
the operations ComfyUI's loader would pick on this machine: fp8 matrix mult or a cast to the compute
dtype), the text-encoder type and dtype for the UMT5 file, the VAE kind comfy.sd.VAE's rules pick."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from .families import TI2V_5B, Family


def _meta_state_dict(path: Path) -> dict:
    """Tensor names and shapes of a safetensors file as meta tensors (no data read)."""
    import torch
    from safetensors import safe_open

    dtypes = {"BF16": torch.bfloat16, "F32": torch.float32, "F16": torch.float16, "U8": torch.uint8,
              "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2}
    out = {}
    with safe_open(str(path), "pt") as f:
        for k in f.keys():
            sl = f.get_slice(k)
            out[k] = torch.empty(sl.get_shape(), dtype=dtypes.get(sl.get_dtype(), torch.float32), device="meta")
    return out


def _fp8_ops(cfg: Any) -> dict[str, Any]:
    """The scaled-fp8 operations ComfyUI's model_base would pick for this config on this machine
    (comfy/ops.py pick_operations): fp8 `_scaled_mm` needs the marker's optimization and a card with fp8
    compute; otherwise each Linear casts its fp8 weight times scale_weight to the compute dtype."""
    import comfy.model_management as mm

    fp8_opt = bool(cfg.optimizations.get("fp8", False))
    compute = bool(mm.supports_fp8_compute(mm.get_torch_device()))
    return {"scaled_fp8": str(cfg.scaled_fp8), "marker_fp8_optimizations": fp8_opt, "card_fp8_compute": compute,
            "fp8_matrix_mult": compute and fp8_opt, "scale_input": fp8_opt}


def detect(base: Path, comfy_dir: Path, cpu: bool = False, fam: Family = TI2V_5B) -> dict:
    import sys

    sys.path.insert(0, str(comfy_dir))
    sys.argv = [sys.argv[0], *(["--cpu"] if cpu else [])]   # ComfyUI parses its own flags on import
    import comfy.options

    comfy.options.enable_args_parsing()
    import comfy.model_detection
    import comfy.sd
    import comfy.text_encoders.sd3_clip
    import comfy.utils

    models = base / "models"
    result: dict[str, Any] = {"family": fam.name}
    unet_files = [fam.comfy_path(models, "unet"), *(fam.comfy_path(models, "unet", n) for n in fam.unet_aliases)]
    unet = _meta_state_dict(unet_files[0])
    cfg = comfy.model_detection.model_config_from_unet(unet, "")
    result["unet"] = {"files": {p.name: str(p.resolve()) for p in unet_files},
                      "same_file": len({p.resolve().stat().st_ino for p in unet_files}) == 1,
                      "class": type(cfg).__name__ if cfg else None,
                      "unet_config": {k: v for k, v in (cfg.unet_config if cfg else {}).items()
                                      if isinstance(v, (int, float, str, bool))},
                      "latent_channels": getattr(getattr(cfg, "latent_format", None), "latent_channels", None),
                      "weight_dtypes": sorted({str(t.dtype) for t in unet.values()})}
    if cfg is not None and cfg.scaled_fp8 is not None:
        result["unet"]["fp8"] = _fp8_ops(cfg)
    te = _meta_state_dict(fam.comfy_path(models, "te"))
    result["te"] = {"model": str(comfy.sd.detect_te_model(te)),
                    "t5_detect": {k: str(v) for k, v in comfy.text_encoders.sd3_clip.t5_xxl_detect(te).items()},
                    "spiece_model": "spiece_model" in te}
    vae = comfy.sd.VAE(sd=comfy.utils.load_torch_file(str(fam.comfy_path(models, "vae"))))
    result["vae"] = {"class": f"{type(vae.first_stage_model).__module__}.{type(vae.first_stage_model).__name__}",
                     "latent_channels": vae.latent_channels}
    module = fam.comfy_vae[0]
    result["ok"] = (result["unet"]["class"] == fam.detect_class and result["te"]["model"].endswith("T5_XXL")
                    and result["vae"]["class"] == f"comfy.ldm.wan.{module}.WanVAE"
                    and vae.latent_channels == fam.latent_channels
                    and (not fam.scaled_fp8 or "float8_e4m3fn" in str(getattr(cfg, "scaled_fp8", None))))
    return result
