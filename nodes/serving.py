"""Turn the Load model and Serving config choices into a validated LaunchSpec.

"auto" asks the memory planner for the fastest configuration that fits the GPUs this
machine shows (NVML), and wires the planner's step-down ladder into the supervisor so an
out-of-memory failure is retried one rung leaner, with the change shown on the node.

The planner plans for the model's default request. When even its leanest configuration
does not fit that, it names a smaller request that does; the plan then carries that
limit, Generate Video applies it wherever its widgets ask for the model's value (0), and
both nodes say so. A request the user set explicitly is never changed.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable, Optional

from ..errors import LauncherError, SpecError
from ..planner.gpus import parse_gpu_memory, query_gpus, visible_indices
from ..planner.ladder import recommend, step_down
from ..server.local_config import LocalConfig
from ..server import versions
from ..server.spec import LaunchSpec, MemoryConfig, ParallelConfig, RuntimeConfig, parse_gpus
from .handles import ModelChoice, RequestLimit, ServingChoice

Fallback = Callable[[LaunchSpec, str], Optional[tuple[LaunchSpec, str]]]
GPU_MEMORY_ENV = "VLLM_OMNI_LAUNCHER_GPU_MEMORY_GB"   # for machines where NVML cannot see the GPUs


def _gpu_memory() -> tuple[list[int], list[float], str]:
    """(visible GPU ids, GiB each, note). The env override wins over NVML."""
    if os.environ.get(GPU_MEMORY_ENV):
        sizes = parse_gpu_memory(os.environ[GPU_MEMORY_ENV])
        return list(range(len(sizes))), sizes, f"GPU memory from {GPU_MEMORY_ENV}"
    gpus, reason = query_gpus()
    if not gpus:
        return [], [], f"no GPU information ({reason})"
    visible = set(visible_indices(len(gpus)))
    chosen = [g for g in gpus if g.index in visible]
    return [g.index for g in chosen], [g.total_gib for g in chosen], "GPUs from NVML"


def _select_gpus(text: str, visible: list[int]) -> Optional[tuple[int, ...]]:
    text = text.strip().lower()
    if text.startswith("count="):
        try:
            count = int(text.split("=", 1)[1])
        except ValueError as exc:
            raise SpecError(f"GPU count '{text}' is not a number", "expected count=N", "write e.g. count=2",
                            setting="gpus") from exc
        ids = visible or list(range(count))
        if count > len(ids):
            raise SpecError(f"{count} GPUs requested, {len(ids)} visible", "count=N takes the first N visible GPUs",
                            f"use count={len(ids)} or fewer", setting="gpus")
        return tuple(ids[:count])
    return parse_gpus(text)


@dataclass(frozen=True)
class ServingPlan:
    """What to launch, what to tell the user about it, and how to step down on OOM."""

    spec: LaunchSpec
    text: str                          # the planner's recommendation ("" when not planned)
    fallback: Optional[Fallback]
    limit: Optional[RequestLimit] = None


def resolve_spec(model: ModelChoice, serving: ServingChoice, config: LocalConfig) -> ServingPlan:
    """The validated spec for these choices, planned when the serving config says auto."""
    visible, sizes, source = _gpu_memory()
    gpus = _select_gpus(serving.gpus, visible)
    auto = serving.parallel_mode == "auto"
    parallel = ParallelConfig() if auto else ParallelConfig(
        mode=serving.parallel_mode, degree=1 if serving.parallel_mode == "none" else serving.parallel_degree,
        vae_patch=serving.vae_patch_parallel)
    base = LaunchSpec(
        model=model.model, gpus=gpus, parallel=parallel,
        memory=MemoryConfig(offload=serving.offload, quantization="fp8" if serving.fp8 else "none",
                            vae_tiling=serving.vae_tiling),
        runtime=RuntimeConfig(cache_backend=serving.cache_backend, enforce_eager=not serving.compile),
        host=config.host, port=config.port)
    plan_text = ""
    limit: Optional[RequestLimit] = None
    spec = base
    if auto and sizes:
        chosen_sizes = sizes if gpus is None else [sizes[visible.index(g)] for g in gpus if g in visible]
        rec = recommend(base, gpus=chosen_sizes if os.environ.get(GPU_MEMORY_ENV) else None,
                        allow_fp8=serving.fp8)
        if rec.spec is None:
            raise LauncherError("No serving configuration fits these GPUs", rec.reason,
                                "use a smaller model (TI2V-5B), fewer frames or a smaller size, or more GPUs",
                                setting="serving", raw=rec.text())
        spec = rec.spec
        plan_text = rec.text()
        if rec.reduced:
            req = rec.request
            limit = RequestLimit(req.width, req.height, req.frames,
                                 f"the serving plan fits {req.label()}, not the model's {rec.asked.label()}")
            plan_text += (f"\nGenerate Video uses {req.label()} where its width, height and frames are 0; "
                          "values you set are sent as they are")
    elif auto:
        plan_text = f"auto: {source}; starting on one GPU without offload (the planner needs GPU memory sizes)"
    # Refuses a missing or mismatched vllm / vllm-omni pair before launch (the same check as `serve`).
    spec.validate(visible_gpus=len(visible) or None, version=versions.checked_server_version(config))

    fallback: Optional[Fallback] = None
    if serving.auto_fallback and sizes:
        def fallback(failed: LaunchSpec, kind: str) -> Optional[tuple[LaunchSpec, str]]:
            ids = failed.gpus if failed.gpus is not None else tuple(visible)
            mem = [sizes[visible.index(i)] for i in ids if i in visible] or sizes
            return step_down(failed, "oom_load" if kind == "oom_load" else "oom", mem)
    return ServingPlan(spec, plan_text, fallback, limit)
