"""What a launch spec may not start with: the rules `LaunchSpec.validate()` applies, in order.

Owns every refusal of a combination the real server would refuse or mis-handle (each a
SpecError naming the setting to change) and the warnings for what may start but is worth
saying. The rules read the spec's parts (sections.py) and plain values, never the spec
itself, so spec.py composes them without an import circle.
"""
from __future__ import annotations

from typing import Optional

from ...errors import SpecError
from ...models import WanFamily
from .flags import Version
from .sections import (CACHE_BACKENDS, OFFLOAD_MODES, PARALLEL_MODES, QUANTIZATIONS, ULYSSES_MODES, MemoryConfig,
                       ParallelConfig, RuntimeConfig)


def choice(name: str, value: str, allowed: tuple[str, ...]) -> None:
    """Refuse a value outside its option set (a workflow can send any string)."""
    if value not in allowed:
        raise SpecError(f"Unknown {name} '{value}'", f"allowed: {', '.join(allowed)}",
                        f"set {name} to one of {', '.join(allowed)}", setting=name.replace(" ", "_"))


def check_choices(p: ParallelConfig, m: MemoryConfig, r: RuntimeConfig) -> None:
    """Every option-set field holds one of its declared values (sections.py)."""
    choice("parallel mode", p.mode, PARALLEL_MODES)
    choice("offload", m.offload, OFFLOAD_MODES)
    choice("quantization", m.quantization, QUANTIZATIONS)
    choice("cache backend", r.cache_backend, CACHE_BACKENDS)
    choice("ulysses mode", p.ulysses_mode, ULYSSES_MODES)


def check_version(family: WanFamily, version: Version) -> None:
    """A family whose pipeline the server's version does not register cannot start."""
    if tuple(version) < family.min_version:
        need = ".".join(str(p) for p in family.min_version)
        raise SpecError(f"{family.label} needs vLLM-Omni {need} or newer",
                        f"the {'.'.join(str(p) for p in version)} server has no {family.pipeline_class} "
                        "pipeline in its registry (docs/wan-pipelines.md, section 1)",
                        f"install vLLM-Omni {need} into the server environment (setup), or pick another model",
                        setting="model")


def check_parallel(p: ParallelConfig, family: WanFamily) -> None:
    """One parallel mode with a degree it can use, heads it can split and a VAE patch that fits."""
    if p.mode == "none":
        if p.degree != 1:
            raise SpecError(f"Parallel degree {p.degree} needs a parallel mode",
                            "with mode 'none' the server runs on one GPU",
                            "pick a parallel mode (ulysses, cfg, ...) or set the degree to 1",
                            setting="parallel_degree")
        if p.hsdp:
            raise SpecError("HSDP on top of no parallel mode has nothing to shard over",
                            "HSDP overlays the Ulysses/ring/CFG world",
                            "choose parallel mode 'hsdp' with a degree instead", setting="parallel_mode")
    elif p.degree < 2:
        raise SpecError(f"Parallel mode '{p.mode}' with degree {p.degree} does nothing",
                        "a parallel mode splits work over at least 2 GPUs",
                        "set the degree to 2 or more, or the mode to 'none'", setting="parallel_degree")
    if p.mode == "cfg" and p.degree != 2:
        raise SpecError(f"CFG parallel degree {p.degree} is not 2",
                        "classifier-free guidance has exactly two passes (positive and negative), "
                        "so upstream can use only 2 ranks for it",
                        "set the degree to 2, or use ulysses/ring for more GPUs", setting="parallel_degree")
    if p.hsdp and p.mode == "tensor":
        raise SpecError("HSDP (FSDP2) is not compatible with TP",
                        "upstream refuses tensor parallel together with HSDP weight sharding",
                        "use HSDP with ulysses/ring/cfg, or tensor parallel without HSDP", setting="parallel_mode")
    if p.mode == "ulysses" and p.ulysses_mode == "strict" and family.attention_heads % p.degree:
        ok = [d for d in range(2, 9) if family.attention_heads % d == 0]
        raise SpecError(
            f"Ulysses degree {p.degree} does not divide {family.label}'s {family.attention_heads} attention heads",
            "strict Ulysses splits the heads evenly across GPUs",
            f"use a degree in {ok}, or set ulysses mode to 'advanced_uaa' (uneven split)",
            setting="parallel_degree")
    if p.mode == "tensor" and p.degree not in tensor_parallel_degrees(family, p.degree):
        ok = tensor_parallel_degrees(family)
        raise SpecError(
            f"Tensor parallel degree {p.degree} cannot split {family.label}'s layers evenly",
            f"tensor parallel splits every layer's {family.attention_heads} attention heads and its "
            f"{family.ffn_dim}-wide feed-forward over the GPUs, and vLLM's parallel linear layers refuse an "
            "uneven split when the model loads",
            f"set Serving Config's parallel_degree to one of {ok} (CLI: --parallel tensor={ok[0] if ok else 2}), "
            "or parallel_mode to ulysses or auto (CLI: --parallel ulysses=N or auto)",
            setting="parallel_degree")
    if p.vae_patch < 1 or (p.vae_patch > 1 and (p.vae_patch > p.world_size or p.world_size % p.vae_patch)):
        raise SpecError(
            f"VAE patch parallel {p.vae_patch} does not fit a world of {p.world_size} GPU(s)",
            "VAE patch parallel runs inside the DiT's parallel world; it cannot add GPUs",
            f"set VAE patch parallel to 1 or to a divisor of {p.world_size}", setting="vae_patch_parallel")


def tensor_parallel_degrees(family: WanFamily, up_to: int = 8) -> list[int]:
    """The tensor parallel degrees (2..`up_to`) that split `family`'s DiT evenly. Upstream's Wan DiT shards two
    widths over the ranks: the attention heads (QKV and output projections) and the feed-forward width (its
    column-parallel `proj` and row-parallel `net_2`); vLLM's parallel linear layers refuse a width the degree does
    not divide when the model loads, so a degree must divide both."""
    return [d for d in range(2, up_to + 1) if family.attention_heads % d == 0 and family.ffn_dim % d == 0]


def check_gpus(gpus: Optional[tuple[int, ...]], p: ParallelConfig, replicas: int,
               visible_gpus: Optional[int]) -> None:
    """The selected (or visible) GPUs are exactly what replicas x the parallel world uses."""
    world, need = p.world_size, replicas * p.world_size
    layout = f"world size = {p.mode} degree {p.degree}"
    if replicas > 1:
        layout = f"{replicas} replicas x {world} GPU(s) each ({layout})"
    if gpus is not None:
        if len(set(gpus)) != len(gpus) or any(g < 0 for g in gpus) or not gpus:
            raise SpecError(f"GPU list {list(gpus)} is not valid", "ids must be distinct and >= 0",
                            "write GPU ids like '0' or '0,1', or 'all'", setting="gpus")
        if need > len(gpus):
            raise SpecError(
                f"The parallel config needs {need} GPUs but {len(gpus)} are selected",
                f"{layout}; upstream would fail with 'Stage 0 requires {world} device(s)'",
                f"select {need} GPUs, or lower the parallel degree or the replicas", setting="gpus")
        if need < len(gpus):
            per = "" if replicas == 1 else f" per replica ({len(gpus)} / {replicas})"
            raise SpecError(
                f"{len(gpus)} GPUs are selected but the parallel config uses {need}",
                f"{layout}; upstream would leave the extra GPUs idle",
                f"pick a {len(gpus) // replicas}-way parallel mode{per} (cfg for 2 GPUs with CFG "
                f"on, ulysses for speed, tensor/hsdp for memory), raise replicas to "
                f"{len(gpus) // world} for more videos at once, or select {need} GPU(s)",
                setting="parallel_mode")
        if visible_gpus is not None and max(gpus) >= visible_gpus:
            raise SpecError(f"GPU {max(gpus)} does not exist", f"this machine shows {visible_gpus} GPU(s)",
                            f"use ids 0..{visible_gpus - 1}", setting="gpus")
    elif visible_gpus is not None and need > visible_gpus:
        raise SpecError(
            f"The parallel config needs {need} GPUs but this machine shows {visible_gpus}",
            f"{layout}; upstream would fail with 'Stage 0 requires {world} device(s)'",
            f"lower the parallel degree or the replicas to fit {visible_gpus} GPU(s)",
            setting="replicas" if replicas > 1 else "parallel_degree")


def check_values(p: ParallelConfig, m: MemoryConfig, r: RuntimeConfig, port: Optional[int]) -> None:
    """Offload that fits the parallel layout, and numbers within the range the server accepts."""
    if m.offload == "layerwise" and (p.world_size > 1 or p.vae_patch > 1):
        raise SpecError(
            "Layerwise offload cannot be combined with multi-GPU parallelism",
            "vLLM-Omni's layerwise (block-wise) offload is single-card only; upstream lists it as "
            "incompatible with sequence, CFG, tensor parallel and HSDP",
            "set offload to 'module' (works with every parallel mode), or set the parallel mode to 'none'",
            setting="offload",
        )
    if r.boundary_ratio is not None and not 0.0 <= r.boundary_ratio <= 1.0:
        raise SpecError(f"Boundary ratio {r.boundary_ratio} is out of range", "it must be within 0..1",
                        "set boundary_ratio between 0 and 1 (Wan2.2: T2V 0.875, I2V 0.9)",
                        setting="boundary_ratio")
    if r.flow_shift is not None and r.flow_shift <= 0:
        raise SpecError(f"Flow shift {r.flow_shift} must be positive", "the scheduler shift divides time steps",
                        "set flow_shift > 0 (Wan2.2: T2V 12, I2V and TI2V 5)", setting="flow_shift")
    if port is not None and not 0 < port < 65536:
        raise SpecError(f"Port {port} is not a TCP port", "ports are 1..65535",
                        "leave the port empty to pick a free one", setting="port")


def warnings_for(m: MemoryConfig, r: RuntimeConfig, family: WanFamily) -> list[str]:
    """What may start but the user should hear about."""
    warnings = []
    if m.quantization == "fp8":
        warnings.append("FP8 for Wan2.2 is not validated upstream (vLLM-Omni's feature table marks "
                        "Wan2.2 quantization unsupported); compare quality against bf16.")
    if r.boundary_ratio in (0.0, 1.0) and family.experts == 2:
        warnings.append(f"boundary_ratio {r.boundary_ratio:g} loads only one A14B expert: less memory, "
                        "lower quality.")
    return warnings
