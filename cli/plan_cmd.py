"""`plan`: estimate GPU memory for a launch spec and a request, and recommend the fastest config that fits.

  python -m vllm_omni_launcher plan --model Wan-AI/Wan2.2-T2V-A14B-Diffusers --width 832 --height 480 \
      --frames 81 --gpu-memory 24,24

Without --gpu-memory it plans for the sizes VLLM_OMNI_LAUNCHER_GPU_MEMORY_GB gives (as a launch
does), else asks NVML for this machine's GPUs (free memory); with it, it plans for GPUs that are
not present (sizes in GiB, e.g. 24,24 or 80 or 2x141). Offload needs host RAM for
the weights it moves off the GPU: --host-ram plans for a machine other than this one. The memory
and speed figures are those of the vLLM-Omni line in the server environment (as `serve` checks
it); where there is none it can use, the pinned line's, and the report says so.

Exit code 0 when the recommendation (or, with --no-recommend, the given spec) fits, 3
(ExitCode.DOES_NOT_FIT) when nothing does (with --no-recommend: when the given spec does not
fit); the report says why either way.
"""
from __future__ import annotations

import argparse
import json

from ..errors import LauncherError
from ..models import check_request
from ..planner.gpus import hypothetical_gpus
from ..planner.gpu_memory_env import GPU_MEMORY_ENV, env_gpu_memory, sizes_source
from ..planner.launch_plan import planning_version
from ..planner.memory import RequestShape, plan
from ..planner.replica_plan import recommend_for
from ..server.config.local_config import load_local_config
from ..server.launch.versions import DEFAULT_VERSION
from .exit_codes import ExitCode
from .launch_options import add_launch_options, spec_from_args
from .report import error_json, for_command_line, option_flags
from .request_options import check_request_options
from .size_options import MAX_BATCH, MAX_HOST_RAM_GIB, add_gpu_memory_option, gib_amount, whole_number


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_launch_options(parser)
    g = parser.add_argument_group("request")
    g.add_argument("--width", type=int, default=None, help="frame width (default: the model's)")
    g.add_argument("--height", type=int, default=None, help="frame height (default: the model's)")
    g.add_argument("--frames", type=int, default=None, help="frame count, 4k+1 (default: the model's)")
    g.add_argument("--no-cfg", action="store_true", help="guidance 1 (no negative branch)")
    g.add_argument("--batch", type=whole_number(1, MAX_BATCH), default=1,
                   help=f"requests run together (--max-num-seqs), 1 to {MAX_BATCH}")
    g = parser.add_argument_group("GPUs")
    add_gpu_memory_option(g, note=f"default: {GPU_MEMORY_ENV} where set, else NVML")
    g.add_argument("--gpu-name", default="", help="name for --gpu-memory GPUs, e.g. 'NVIDIA GeForce RTX 4090'")
    g.add_argument("--p2p", choices=("yes", "no", "unknown"), default="unknown",
                   help="peer-to-peer access between the GPUs (default: NVML when real, else unknown)")
    g.add_argument("--allow-fp8", action="store_true", help="let the recommendation use FP8 (unvalidated for Wan2.2)")
    g.add_argument("--host-ram", type=gib_amount(MAX_HOST_RAM_GIB), default=None, metavar="GIB",
                   help="host RAM available for offload, in GiB (default: this machine's, via psutil)")
    parser.add_argument("--no-recommend", action="store_true",
                        help=f"only the breakdown of the given spec; exit {int(ExitCode.DOES_NOT_FIT)} when it does "
                             "not fit, as for no recommendation")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace) -> int:
    check_request_options(args)            # the same rule as `generate`
    config = load_local_config()
    spec = spec_from_args(args, default_host=config.host)
    family = spec.family

    def given(value: "int | None", default: int) -> int:
        return default if value is None else value
    req = RequestShape(width=given(args.width, family.width), height=given(args.height, family.height),
                       frames=given(args.frames, family.frames), cfg=not args.no_cfg, batch=args.batch)
    check_request(family, width=req.width, height=req.height, frames=req.frames,
                  has_image=family.image_input == "required")
    sizes, sizes_note = args.gpu_memory, ""
    if sizes is None:
        sizes = env_gpu_memory()          # as a launch plans (planner/launch_plan.py owns the variable)
        sizes_note = sizes_source(sizes) if sizes is not None else ""
    gpus = hypothetical_gpus(sizes, name=args.gpu_name) if sizes is not None else None
    host = -1.0 if args.host_ram is None else args.host_ram
    version, unread = planning_version(config)
    warnings: list[str] = []
    try:
        warnings = spec.validate(visible_gpus=len(gpus) if gpus else None, version=version or DEFAULT_VERSION)
        spec_error = None
    except LauncherError as exc:
        if args.no_recommend:
            raise                   # nothing else to report: the given spec is the whole question
        spec_error = _for_plan(exc)
    if unread:
        warnings.append(f"{unread.rstrip('.')}: the estimates use the figures of vLLM-Omni "
                        f"{'.'.join(map(str, DEFAULT_VERSION))}, the line setup installs")
    breakdown = None
    if spec_error is None:
        breakdown = plan(spec, req, gpus, host_available_gib=host, server_version=version)
    rec = None
    rec_error = None
    if not args.no_recommend:
        p2p = {"yes": True, "no": False, "unknown": None}[args.p2p]
        try:
            rec = recommend_for(spec, req, gpus, p2p=p2p, allow_fp8=args.allow_fp8, host_available_gib=host,
                                server_version=version, speed=args.speed)
        except LauncherError as exc:
            rec_error = _for_plan(exc)
    if args.json:
        out = {"plan": breakdown.to_dict() if breakdown else None,
               "spec_error": error_json(spec_error)["error"] if spec_error else None,
               "warnings": warnings,
               "recommendation": rec.to_dict() if rec else None,
               "recommendation_error": error_json(rec_error)["error"] if rec_error else None,
               "gpu_sizes_from": "--gpu-memory" if args.gpu_memory is not None else
               GPU_MEMORY_ENV if sizes_note else "NVML"}
        print(json.dumps(out, indent=1))
    else:
        if sizes_note:
            print(f"note: {sizes_note} (--gpu-memory plans for other sizes)")
        if spec_error:
            print(f"the given launch options cannot start: {spec_error}")
        elif breakdown:
            print("== the given launch options ==")
            print(breakdown.text())
        for w in warnings:
            print(f"warning: {w}")
        if rec:
            print("\n== recommendation ==")
            print(rec.text())
            for w in rec.warnings:          # the text gives none (planner/recommendation.py)
                print(f"warning: {w}")
        elif rec_error:
            print(f"\nno recommendation: {rec_error}")
    fits = rec.spec is not None if rec is not None else breakdown is not None and breakdown.fits is not False
    return ExitCode.OK if fits else ExitCode.DOES_NOT_FIT


def _for_plan(exc: LauncherError) -> LauncherError:
    """An error plan reports inside its output, its fix naming plan's options (as the CLI's error printer does)."""
    parser = argparse.ArgumentParser(add_help=False)
    add_arguments(parser)
    return for_command_line(exc, option_flags(parser))
