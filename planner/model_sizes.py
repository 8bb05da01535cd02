"""How big each part of a Wan2.2 model is: from the folder itself, else a built-in table.

vLLM-Omni loads every component in the server dtype (bf16 by default), the VAE too
(`pipeline_wan2_2.py` passes `torch_dtype=dtype` to the VAE), so the GPU bytes of a part are
its parameter count x 2, whatever dtype the files hold. A local Diffusers folder is read
cheaply: only the safetensors headers (tensor shapes) and the config.json files, never the
weights. The table holds the three Wan-AI *-Diffusers repos, with parameter counts that the
random-weight H200 runs confirm: "weights 64.2 GiB loaded" for T2V-A14B and "21.2 GiB" for
TI2V-5B (docs/upstream-facts.md, "H200 measurements") are 2 bytes x these counts.

Wan2.2 S2V-14B is the exception twice over. Its repo has Wan's original layout (no model_index.json:
the DiT's safetensors and config.json at the root, the text encoder and VAE as .pth files), read by
`sizes_from_original_folder`. And it has a fourth part, the wav2vec2 audio encoder, which upstream
loads with transformers' `Wav2Vec2ForCTC.from_pretrained(path)` and no dtype (pipeline_wan2_2_s2v.py:
674-680): transformers 5 then takes the config's dtype, else the weights' own (`dtype="auto"`), fp32 in
the released folder, and moves it to the GPU whatever the offload setting, so it is resident at 4
bytes a parameter.
"""
from __future__ import annotations

import json
import struct
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

from ..models import WanFamily, family_for, is_s2v_original

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
    # VACE: the blocks of `vace_layers`. The forward computes every block's hint before the main blocks
    # and holds them all until each is added (vllm-omni wan2_2_vace_transformer.py:256-289).
    vace_blocks: int = 0

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
    audio_encoder_params: float = 0.0    # S2V's wav2vec2 (none for the other families)
    audio_encoder_bytes: float = 4.0     # bytes per parameter as upstream loads it (its checkpoint's dtype)
    # S2V's original layout: upstream converts the Wan T5 checkpoint with `shared` and `encoder.embed_tokens`
    # as two parameters over one tensor, and moving the module to the GPU copies each (pipeline_wan2_2_s2v.py:
    # 459-461, 498-500, 664-665): a second token embedding on the GPU. Measured: the server logs 44.39 GiB
    # loaded where the parts without it come to 42.35 (bench/results/h100-wan-pipelines-vllm-omni-0.30/).
    embedding_copy_params: float = 0.0

    def dit_gib(self, index: int, bytes_per_param: float = BF16) -> float:
        return self.dit_params[index] * bytes_per_param / GIB

    @property
    def text_encoder_gib(self) -> float:
        """On the GPU: the encoder, and the second embedding where the loader makes one."""
        return (self.text_encoder_params + self.embedding_copy_params) * BF16 / GIB

    @property
    def vae_gib(self) -> float:
        return self.vae_params * BF16 / GIB

    @property
    def audio_encoder_gib(self) -> float:
        return self.audio_encoder_params * self.audio_encoder_bytes / GIB

    def block_gib(self, index: int = 0) -> float:
        """One transformer block (what layerwise offload streams and HSDP gathers)."""
        return self.dit_gib(index) * 0.985 / self.dit.layers

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["dit_gib"] = [round(self.dit_gib(i), 3) for i in range(len(self.dit_params))]
        data["text_encoder_gib"] = round(self.text_encoder_gib, 3)
        data["vae_gib"] = round(self.vae_gib, 3)
        data["audio_encoder_gib"] = round(self.audio_encoder_gib, 3)
        return data


# Wan2.2 Diffusers repos. DiT: models/ dit_params_b (T2V/I2V experts 14.29 B, TI2V 5.00 B);
# UMT5-XXL encoder 5.68 B (as built for docs/upstream-facts.md, "H200 measurements");
# VAEs counted from diffusers'
# AutoencoderKLWan with the real configs: Wan2.1 126.9 M, Wan2.2 704.7 M.
_UMT5_XXL = 5.68e9
_VAE = {"wan2.1": 126.9e6, "wan2.2": 704.7e6}
# S2V's wav2vec2-large-xlsr-53-english: transformers' Wav2Vec2ForCTC at XLSR-53 large sizes (24 layers, 1024
# wide, 7 conv layers of 512) with its 33-token CTC head, 315.47 M (bench/gpu/manifest_s2v_14b.json), fp32.
_WAV2VEC2_XLSR53 = 315.47e6
_UMT5_EMBEDDING = 256384 * 4096   # UMT5-XXL's token embedding (vocabulary x width)
_S2V_AUDIO_DIR = "wav2vec2-large-xlsr-53-english"


def builtin_sizes(family: WanFamily) -> ModelSizes:
    """The sizes of `family`'s released repo: the DiT's parameters and shape as the family declares them
    (models/families.py, one owner for family facts), the encoders and VAE from the table above."""
    vae_kind = "wan2.2" if family.vae_spatial == 16 else "wan2.1"
    return ModelSizes(
        family=family.key,
        dit_params=tuple([family.dit_params_b * 1e9] * family.experts),
        text_encoder_params=_UMT5_XXL,
        vae_params=_VAE[vae_kind],
        dit=DitShape(layers=family.layers, heads=family.attention_heads, head_dim=family.head_dim,
                     ffn_dim=family.ffn_dim, in_channels=family.dit_in_channels, vace_blocks=family.vace_blocks),
        vae_kind=vae_kind,
        source=f"built-in table for {family.hf_id}",
        audio_encoder_params=_WAV2VEC2_XLSR53 if family.pipeline == "s2v" else 0.0,
        embedding_copy_params=_UMT5_EMBEDDING if family.pipeline == "s2v" else 0.0,   # its repo: original layout
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
                             text_dim=int(cfg.get("text_dim", 4096)),
                             vace_blocks=len(cfg.get("vace_layers") or ()) or shape.vace_blocks)
        except (KeyError, TypeError, ValueError):
            notes.append("transformer/config.json lacks the Wan shape keys: used the table's shape")
    vcfg = _read_json(folder / "vae" / "config.json")
    vae_kind = table.vae_kind
    if vcfg:
        vae_kind = "wan2.2" if int(vcfg.get("z_dim", 16)) == 48 or vcfg.get("is_residual") else "wan2.1"
    audio_params, audio_bytes, _ = _audio_encoder(folder, table)
    return ModelSizes(family=family.key, dit_params=tuple(dit) or table.dit_params, text_encoder_params=te,
                      vae_params=vae, dit=shape, vae_kind=vae_kind, source=f"read from {folder}",
                      notes=tuple(notes), audio_encoder_params=audio_params, audio_encoder_bytes=audio_bytes)


_TORCH_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


def _audio_encoder(model: Path, table: ModelSizes) -> tuple[float, float, bool]:
    """(parameters, bytes per parameter on the GPU, read from the folder) of S2V's wav2vec2 folder in `model`,
    as `from_pretrained` with dtype "auto" loads it: the config's dtype, else the weights' own; the table's
    when the folder holds no weights (or the family has no audio encoder)."""
    folder = model / _S2V_AUDIO_DIR
    fallback = (table.audio_encoder_params, table.audio_encoder_bytes, False)
    if not table.audio_encoder_params:
        return fallback
    cfg = _read_json(folder / "config.json")
    named = _TORCH_DTYPE_BYTES.get(str(cfg.get("dtype") or cfg.get("torch_dtype") or ""))
    files = sorted(folder.glob("*.safetensors"))
    if files:
        params, nbytes = (sum(x) for x in zip(*(_safetensors_params(f) for f in files)))
        return params, float(named or (nbytes / params if params else 4)), True
    bins = sorted(folder.glob("*.bin"))
    if not bins:
        return fallback
    return sum(f.stat().st_size for f in bins) / 4.0, float(named or 4), True   # no header: the released fp32


def _file_params(path: Path, bytes_per_param: int) -> Optional[float]:
    """A .pth file's parameters from its size (Wan names each file for its dtype), None when absent."""
    try:
        return path.stat().st_size / bytes_per_param
    except OSError:
        return None


def sizes_from_original_folder(folder: Path, family: WanFamily) -> ModelSizes:
    """S2V's original layout (pipeline_wan2_2_s2v.py:632-688): the DiT's safetensors headers and config.json
    at the root, the bf16 UMT5 and fp32 VAE .pth files by size, the wav2vec2 folder; missing parts from the table."""
    table = builtin_sizes(family)
    notes: list[str] = []
    shards = sorted(folder.glob("diffusion_pytorch_model*.safetensors"))
    dit = sum(_safetensors_params(f)[0] for f in shards) if shards else None
    te = _file_params(folder / "models_t5_umt5-xxl-enc-bf16.pth", 2)
    vae = _file_params(folder / "Wan2.1_VAE.pth", 4)
    audio_params, audio_bytes, audio_read = _audio_encoder(folder, table)
    for part, value in (("diffusion_pytorch_model-*.safetensors", dit), ("models_t5_umt5-xxl-enc-bf16.pth", te),
                        ("Wan2.1_VAE.pth", vae), (_S2V_AUDIO_DIR + "/", audio_read or None)):
        if value is None:
            notes.append(f"{part} is not there yet: assumed the table's size")
    cfg = _read_json(folder / "config.json")
    shape = table.dit
    try:
        if cfg:
            shape = DitShape(layers=int(cfg["num_layers"]), heads=int(cfg["num_heads"]),
                             head_dim=int(cfg["dim"]) // int(cfg["num_heads"]), ffn_dim=int(cfg["ffn_dim"]),
                             in_channels=int(cfg.get("in_dim", shape.in_channels)),
                             text_dim=int(cfg.get("text_dim", 4096)))
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        notes.append("config.json lacks Wan's shape keys: used the table's shape")
    return ModelSizes(family=family.key, dit_params=(dit,) if dit else table.dit_params,
                      text_encoder_params=te or table.text_encoder_params, vae_params=vae or table.vae_params,
                      dit=shape, vae_kind=table.vae_kind, source=f"read from {folder} (original layout)",
                      notes=tuple(notes), audio_encoder_params=audio_params, audio_encoder_bytes=audio_bytes,
                      embedding_copy_params=_UMT5_EMBEDDING)


def model_sizes(model: str) -> ModelSizes:
    """Sizes for an HF id (built-in table) or a local folder (read from its files: Diffusers, or S2V's original)."""
    family = family_for(model)
    path = Path(model).expanduser()
    if path.is_dir():
        if is_s2v_original(path):
            return sizes_from_original_folder(path, family)
        return sizes_from_folder(path, family)
    return builtin_sizes(family)
