"""The launch options shared by argv, serve, generate and plan, turned into a LaunchSpec."""
from __future__ import annotations

import argparse

from ..server.spec import (CACHE_BACKENDS, OFFLOAD_MODES, QUANTIZATIONS, ULYSSES_MODES, LaunchSpec,
                           MemoryConfig, ParallelConfig, RuntimeConfig, parse_gpus, parse_parallel)


def add_launch_options(parser: argparse.ArgumentParser, *, model_required: bool = True) -> None:
    g = parser.add_argument_group("launch options")
    g.add_argument("--model", required=model_required,
                   help="HF id (Wan-AI/Wan2.2-T2V-A14B-Diffusers, ...-I2V-A14B-, ...-TI2V-5B-) or local Diffusers folder")
    g.add_argument("--gpus", default="all", help="GPU ids, e.g. '0' or '0,1'; 'all' = every visible GPU")
    g.add_argument("--parallel", default="none",
                   help="MODE=DEGREE with MODE in none, tensor (tp), ulysses (usp), ring, cfg, hsdp; e.g. ulysses=2")
    g.add_argument("--hsdp", action="store_true", help="also shard weights with HSDP over the ulysses/ring/cfg world")
    g.add_argument("--ulysses-mode", default="strict", choices=ULYSSES_MODES)
    g.add_argument("--vae-patch", type=int, default=1, help="VAE patch parallel size (within the parallel world)")
    g.add_argument("--offload", default="none", choices=OFFLOAD_MODES)
    g.add_argument("--quantization", default="none", choices=QUANTIZATIONS)
    g.add_argument("--vae-tiling", action="store_true")
    g.add_argument("--vae-slicing", action="store_true")
    g.add_argument("--cache-backend", default="none", choices=CACHE_BACKENDS)
    g.add_argument("--enforce-eager", action="store_true", help="skip torch.compile (faster start, slower steps)")
    g.add_argument("--boundary-ratio", type=float, default=None)
    g.add_argument("--flow-shift", type=float, default=None)
    g.add_argument("--served-model-name", default=None)
    g.add_argument("--host", default=None, help="bind host (default: local config, else 127.0.0.1)")
    g.add_argument("--port", type=int, default=None, help="port (default: a free one)")
    g.add_argument("--extra-flag", action="append", default=[], metavar="FLAG[=VALUE]",
                   help="an allow-listed vllm serve flag, e.g. --extra-flag=--max-num-seqs=2 (repeatable)")


def spec_from_args(args: argparse.Namespace, default_host: str = "127.0.0.1") -> LaunchSpec:
    mode, degree = parse_parallel(args.parallel)
    return LaunchSpec(
        model=args.model,
        gpus=parse_gpus(args.gpus),
        parallel=ParallelConfig(mode=mode, degree=degree, vae_patch=args.vae_patch,
                                ulysses_mode=args.ulysses_mode, hsdp=args.hsdp),
        memory=MemoryConfig(offload=args.offload, quantization=args.quantization,
                            vae_tiling=args.vae_tiling, vae_slicing=args.vae_slicing),
        runtime=RuntimeConfig(cache_backend=args.cache_backend, enforce_eager=args.enforce_eager,
                              boundary_ratio=args.boundary_ratio, flow_shift=args.flow_shift),
        served_model_name=args.served_model_name,
        host=args.host or default_host,
        port=args.port,
        extra_flags=tuple(args.extra_flag),
    )
