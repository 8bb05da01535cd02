"""The launch spec's sections: the option sets (each declared once, as a Literal type) and the
parallel, memory and runtime configs, each turning its own fields into `vllm serve` flags.

Owns which flag a section setting becomes; whether a combination may start is spec_rules.py's,
and the whole command (model, host, port, key, GPUs) is spec.py's.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional

from ..config.settings import options, setting

# Each option set is declared once, as a Literal type; the tuples are its values for code that lists them.
ParallelMode = Literal["none", "tensor", "ulysses", "ring", "cfg", "hsdp"]
OffloadMode = Literal["none", "module", "layerwise"]
Quantization = Literal["none", "fp8"]
CacheBackend = Literal["none", "cache_dit"]
UlyssesMode = Literal["strict", "advanced_uaa"]
PARALLEL_MODES = options(ParallelMode)
OFFLOAD_MODES = options(OffloadMode)
QUANTIZATIONS = options(Quantization)
CACHE_BACKENDS = options(CacheBackend)
ULYSSES_MODES = options(UlyssesMode)

_MODE_FLAG = {"tensor": "--tensor-parallel-size", "ulysses": "--usp", "ring": "--ring",
              "cfg": "--cfg-parallel-size", "hsdp": "--hsdp-shard-size"}


@dataclass(frozen=True)
class ParallelConfig:
    """Exactly one multi-GPU mode and its degree, plus VAE patch parallel inside that world.

    `hsdp` adds FSDP2 weight sharding over the Ulysses/ring/CFG world (the configuration
    upstream's own 2xH100 baseline uses); mode "hsdp" alone is pure weight sharding.
    """

    mode: ParallelMode = setting(
        "none", "one multi-GPU mode: tensor (splits the weights: memory), ulysses (sequence parallel: speed), "
        "ring, cfg (the two guidance passes on 2 GPUs: little traffic, best without NVLink/P2P), "
        "hsdp (FSDP2 weight sharding)")
    degree: int = setting(1, "GPUs the parallel mode uses (its world size)")
    vae_patch: int = setting(1, "VAE patch parallel size: split the VAE decode over GPUs of the parallel world")
    ulysses_mode: UlyssesMode = setting(
        "strict", "strict splits the attention heads evenly (the degree must divide them: A14B 40, TI2V-5B 24); "
        "advanced_uaa allows an uneven split")
    hsdp: bool = setting(False, "also shard the weights with HSDP (FSDP2) over the ulysses/ring/cfg world")

    @property
    def world_size(self) -> int:
        return 1 if self.mode == "none" else self.degree

    def flags(self) -> list[str]:
        out: list[str] = []
        if self.mode == "hsdp":
            out += ["--use-hsdp", "--hsdp-shard-size", str(self.degree)]
        elif self.mode != "none":
            out += [_MODE_FLAG[self.mode], str(self.degree)]
            if self.hsdp:
                out.append("--use-hsdp")
        if self.mode == "ulysses" and self.ulysses_mode != "strict":
            out += ["--ulysses-mode", self.ulysses_mode]
        if self.vae_patch > 1:
            out += ["--vae-patch-parallel-size", str(self.vae_patch)]
        return out


@dataclass(frozen=True)
class MemoryConfig:
    """How weights and activations are kept small enough for the card."""

    offload: OffloadMode = setting(
        "none", "module: the text encoder and the DiT take turns on the GPU, the other waits in CPU memory "
        "(works with every parallel mode); layerwise: DiT blocks streamed from CPU memory (one GPU only)")
    quantization: Quantization = setting("none", "fp8: FP8 DiT weights (not validated upstream for Wan2.2)")
    vae_tiling: bool = setting(False, "decode the VAE in tiles: a lower memory peak for long or large clips")
    vae_slicing: bool = setting(False, "decode the VAE one video at a time when requests are batched")

    def flags(self) -> list[str]:
        out: list[str] = []
        if self.offload == "module":
            out.append("--enable-cpu-offload")
        elif self.offload == "layerwise":
            out.append("--enable-layerwise-offload")
        if self.quantization == "fp8":
            out += ["--quantization", "fp8"]
        if self.vae_tiling:
            out.append("--vae-use-tiling")
        if self.vae_slicing:
            out.append("--vae-use-slicing")
        return out


@dataclass(frozen=True)
class RuntimeConfig:
    """Speed and model-behaviour switches fixed for the server's lifetime."""

    cache_backend: CacheBackend = setting("none", "cache_dit: reuse DiT block outputs between steps (faster)")
    enforce_eager: bool = setting(False, "skip torch.compile: faster start, slower steps (upstream compiles)")
    boundary_ratio: Optional[float] = setting(
        None, "A14B: the fraction of the denoise run by the high-noise expert, 0..1 (T2V 0.875, I2V 0.9); "
        "set on the server it beats the request's value")
    flow_shift: Optional[float] = setting(
        None, "the scheduler's flow shift (T2V 12, I2V and TI2V 5); a request's value beats the server's")

    def flags(self) -> list[str]:
        out: list[str] = []
        if self.cache_backend != "none":
            out += ["--cache-backend", self.cache_backend]
        if self.enforce_eager:
            out.append("--enforce-eager")
        if self.boundary_ratio is not None:
            out += ["--boundary-ratio", _num(self.boundary_ratio)]
        if self.flow_shift is not None:
            out += ["--flow-shift", _num(self.flow_shift)]
        return out


def _num(value: float) -> str:
    return f"{value:g}"
