"""How big each part of a Wan2.2 model is: from the folder itself, else a built-in table.

vLLM-Omni loads every component in the server dtype (bf16 by default), the VAE too
(`pipeline_wan2_2.py` passes `torch_dtype=dtype` to the VAE), so the GPU bytes of a part are
its parameter count x 2, whatever dtype the files hold. A local Diffusers folder is read
cheaply: only the safetensors headers (tensor shapes) and the config.json files, never the
weights. The table holds the three Wan-AI *-Diffusers repos, with parameter counts that the
random-weight H200 runs confirm: "weights 64.2 GiB loaded" for T2V-A14B and "21.2 GiB" for
TI2V-5B (docs/upstream-facts.md, "H200 measurements") are 2 bytes x these counts.
"""
from __future__ import annotations

import json
import struct
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

from ..models import WanFamily, family_for

GIB = 1024 ** 3
BF16 = 2

_DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "I64": 8, "I32": 4,
                "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}


@dataclass(frozen=True)
class DitShape:
    """The transformer dimensions that set activation and per-block sizes."""

    layers: int
    heads: int
    head_dim: int
    ffn_dim: int
    in_channels: int
    text_dim: int = 4096

    @property
    def hidden(self) -> int:
        return self.heads * self.head_dim


@dataclass(frozen=True)
class ModelSizes:
    """Parameter counts per component (GPU bytes = params x bytes per param of the load dtype)."""

    family: str
    dit_params: tuple[float, ...]        # one entry per expert present: (transformer, transformer_2)
    text_encoder_params: float
    vae_params: float
    dit: DitShape
    vae_kind: str                        # "wan2.1" (x8, z16) | "wan2.2" (x16, z48)
    source: str                          # "built-in table" or the folder read
    notes: tuple[str, ...] = field(default=())

    def dit_gib(self, index: int, bytes_per_param: float = BF16) -> float:
        return self.dit_params[index] * bytes_per_param / GIB

    @property
    def text_encoder_gib(self) -> float:
        return self.text_encoder_params * BF16 / GIB

    @property
    def vae_gib(self) -> float:
        return self.vae_params * BF16 / GIB

    def block_gib(self, index: int = 0) -> float:
        """One transformer block (what layerwise offload streams and HSDP gathers)."""
        return self.dit_gib(index) * 0.985 / self.dit.layers

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["dit_gib"] = [round(self.dit_gib(i), 3) for i in range(len(self.dit_params))]
        data["text_encoder_gib"] = round(self.text_encoder_gib, 3)
        data["vae_gib"] = round(self.vae_gib, 3)
        return data


# Wan2.2 Diffusers repos. DiT: models/ dit_params_b (T2V/I2V experts 14.29 B, TI2V 5.00 B);
# UMT5-XXL encoder 5.68 B (as built for docs/upstream-facts.md, "H200 measurements");
# VAEs counted from diffusers'
# AutoencoderKLWan with the real configs: Wan2.1 126.9 M, Wan2.2 704.7 M.
_UMT5_XXL = 5.68e9
_VAE = {"wan2.1": 126.9e6, "wan2.2": 704.7e6}
_SHAPES = {
    "t2v_a14b": DitShape(layers=40, heads=40, head_dim=128, ffn_dim=13824, in_channels=16),
    "i2v_a14b": DitShape(layers=40, heads=40, head_dim=128, ffn_dim=13824, in_channels=36),
    "ti2v_5b": DitShape(layers=30, heads=24, head_dim=128, ffn_dim=14336, in_channels=48),
    # docs/wan-pipelines.md: the repos' transformer configs (VACE: Wan2.1 14B / 1.3B plus its VACE
    # blocks, counted in models/ dit_params_b; S2V: wan_s2v_14B; FastWan: the TI2V-5B DiT).
    "vace_14b": DitShape(layers=40, heads=40, head_dim=128, ffn_dim=13824, in_channels=16),
    "vace_1_3b": DitShape(layers=30, heads=12, head_dim=128, ffn_dim=8960, in_channels=16),
    "s2v_14b": DitShape(layers=40, heads=40, head_dim=128, ffn_dim=13824, in_channels=16),
    "fastwan_ti2v_5b": DitShape(layers=30, heads=24, head_dim=128, ffn_dim=14336, in_channels=48),
}


def builtin_sizes(family: WanFamily) -> ModelSizes:
    vae_kind = "wan2.2" if family.vae_spatial == 16 else "wan2.1"
    return ModelSizes(
        family=family.key,
        dit_params=tuple([family.dit_params_b * 1e9] * family.experts),
        text_encoder_params=_UMT5_XXL,
        vae_params=_VAE[vae_kind],
        dit=_SHAPES[family.key],
        vae_kind=vae_kind,
        source=f"built-in table for {family.hf_id}",
    )


def _safetensors_params(path: Path) -> tuple[float, int]:
    """(parameter count, bytes on disk of tensor data) from a .safetensors header only."""
    with path.open("rb") as fh:
        (length,) = struct.unpack("<Q", fh.read(8))
        if length > 100_000_000:
            raise ValueError(f"{path.name}: implausible safetensors header length {length}")
        header = json.loads(fh.read(length))
    params = 0
    nbytes = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        n = 1
        for d in info["shape"]:
            n *= int(d)
        params += n
        nbytes += n * _DTYPE_BYTES.get(info.get("dtype", "BF16"), 2)
    return float(params), nbytes


def _component_params(folder: Path) -> Optional[float]:
    """Parameters of one component subfolder, or None if it holds no safetensors."""
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        bins = sorted(folder.glob("*.bin")) + sorted(folder.glob("*.pt"))
        if bins:   # no header to read: estimate from size assuming the common fp32/bf16 layouts
            size = sum(f.stat().st_size for f in bins)
            return size / 4.0 if folder.name == "vae" else size / 2.0
        return None
    return sum(_safetensors_params(f)[0] for f in files)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def sizes_from_folder(folder: Path, family: WanFamily) -> ModelSizes:
    """Read parameter counts and the DiT shape from a local Diffusers folder.

    Missing parts fall back to the table (with a note), so a partly downloaded folder still
    gets a plan; the doctor reports the folder as incomplete.
    """
    table = builtin_sizes(family)
    notes: list[str] = []
    dit: list[float] = []
    index = _read_json(folder / "model_index.json")
    for i, sub in enumerate(("transformer", "transformer_2")):
        entry = index.get(sub)
        if sub == "transformer_2" and (not entry or entry[0] is None) and not (folder / sub).is_dir():
            continue
        params = _component_params(folder / sub) if (folder / sub).is_dir() else None
        if params is None:
            if i < len(table.dit_params):
                notes.append(f"{sub}/ has no weights yet: assumed {table.dit_params[i] / 1e9:.2f} B parameters")
                params = table.dit_params[i]
            else:
                continue
        dit.append(params)
    te = _component_params(folder / "text_encoder") if (folder / "text_encoder").is_dir() else None
    if te is None:
        notes.append("text_encoder/ has no weights yet: assumed UMT5-XXL (5.68 B parameters)")
        te = table.text_encoder_params
    vae = _component_params(folder / "vae") if (folder / "vae").is_dir() else None
    if vae is None:
        notes.append("vae/ has no weights yet: assumed the table's VAE size")
        vae = table.vae_params
    cfg = _read_json(folder / "transformer" / "config.json") or _read_json(folder / "transformer_2" / "config.json")
    shape = table.dit
    if cfg:
        try:
            shape = DitShape(layers=int(cfg["num_layers"]), heads=int(cfg["num_attention_heads"]),
                             head_dim=int(cfg["attention_head_dim"]), ffn_dim=int(cfg["ffn_dim"]),
                             in_channels=int(cfg.get("in_channels", shape.in_channels)),
                             text_dim=int(cfg.get("text_dim", 4096)))
        except (KeyError, TypeError, ValueError):
            notes.append("transformer/config.json lacks the Wan shape keys: used the table's shape")
    vcfg = _read_json(folder / "vae" / "config.json")
    vae_kind = table.vae_kind
    if vcfg:
        vae_kind = "wan2.2" if int(vcfg.get("z_dim", 16)) == 48 or vcfg.get("is_residual") else "wan2.1"
    return ModelSizes(family=family.key, dit_params=tuple(dit) or table.dit_params, text_encoder_params=te,
                      vae_params=vae, dit=shape, vae_kind=vae_kind, source=f"read from {folder}",
                      notes=tuple(notes))


def model_sizes(model: str) -> ModelSizes:
    """Sizes for an HF id (built-in table) or a local Diffusers folder (read from its files)."""
    family = family_for(model)
    path = Path(model).expanduser()
    if path.is_dir():
        return sizes_from_folder(path, family)
    return builtin_sizes(family)
