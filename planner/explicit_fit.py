"""Whether explicit serving settings (not `auto`) fit the GPUs: refuse before launching, or warn.

`auto` asks the memory planner for a configuration that fits; explicit settings are the user's,
so they are launched as chosen, but a launch the memory plan shows cannot load would download
the model (65 GB for an A14B) and then fail out of memory. So where the GPU sizes are known
(NVML, VLLM_OMNI_LAUNCHER_GPU_MEMORY_GB, or `argv --gpu-memory`), each replica is planned on
its GPUs for the model's default request, and

- what the server holds from the start (weights, text encoder, CUDA context: the plan's resident
  phase, which no request size changes) over a card by more than `REFUSE_OVER` is refused before
  anything starts;
- any other misfit (a peak over the card within that error, or one that only the request's
  activations or decode cause, which a smaller request or the OOM step-down may avoid) is one of
  the plan's warnings (`LaunchPlan.warnings`), which the Local Server node and the command line show.

The cards are planned at their total size, not NVML's free memory: the server this launch
replaces still holds its memory while the new one is planned (the doctor reports memory other
programs hold).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Optional, Sequence

from ..errors import LauncherError
from ..server.launch.flags import Version
from ..server.launch.spec import LaunchSpec
from .gpu_memory_env import GPU_MEMORY_ENV
from .memory_plan import GpuPlan, MemoryPlan
from .replica_plan import gpu_pool, plan_replicas
from .request_shape import RequestShape

# The calibration's worst measured points are 7.1% (a tiled decode) and 6.0% (VACE-14B) off
# (planner/calibration.py); a load more than 10% over the card does not fit even if the estimate
# is high by that much, so refusing it cannot refuse a launch that would have started.
REFUSE_OVER = 0.10
# What the fix says (Serving Config's widgets; the command line names its flags for them).
FIX = ("on Serving Config, set parallel_mode to auto (the planner picks the fastest configuration that fits these "
       "GPUs) or to tensor or hsdp (they shard the weights), or set offload to module or layerwise and turn "
       "vae_tiling on")


def check_explicit_fit(spec: LaunchSpec, ids: Sequence[int], visible: Sequence[int], sizes: Sequence[float],
                       source: str, *, cfg: bool, server_version: Version, refuse: bool) -> Optional[str]:
    """The warning for `spec` on GPUs `ids` (None when it fits or cannot be told); raises the
    refusal (when `refuse`: a launch, not `argv`) where the load alone does not fit (see the module doc).
    `visible`/`sizes`: this machine's GPU ids and their total GiB; `source`: where the sizes came from."""
    request = replace(RequestShape.default_for(spec.family), cfg=cfg)
    pool = gpu_pool(visible, sizes, True)
    plans = plan_replicas(spec, list(ids), request, pool=pool, server_version=server_version).plans
    worst = [(p, g, g.gpu.available_gib) for p in plans for g in p.gpus if g.fits is False and g.gpu is not None]
    if not worst:
        host = next((p for p in plans if p.fits is False), None)
        return None if host is None else (
            f"host RAM is too small for what offload '{spec.memory.offload}' moves off the GPUs (needs "
            f"{host.host_ram.get('needed_gib', 0):.1f} GiB): expect the server to fail while loading; use GPUs "
            "that hold the model, or free host RAM")
    p, g, card = max(worst, key=lambda w: _load_gib(w[1]) / w[2])
    over = ",".join(str(gp.rank if gp.gpu is None else gp.gpu.index) for _, gp, _ in worst)
    what = (f"peak {g.peak_gib:.1f} GiB vs {card:.1f} GiB per GPU (GPU {over}) for "
            f"{spec.family.label} at {request.label()}")
    if refuse and _load_gib(g) > card * (1 + REFUSE_OVER):
        raise LauncherError(
            f"These serving settings do not fit the GPUs: {what}",
            f"{_layout(p)} holds {_load_gib(g):.1f} GiB on a GPU from the start (weights, text encoder, CUDA "
            f"context), more than {REFUSE_OVER:.0%} over the card, beyond the memory plan's error (calibrated for "
            f"{p.calibration_text}, its measured points are within about 7%); the server would download the model "
            f"and then fail out of memory. GPU sizes: {source}",
            f"{FIX}; if those sizes are wrong, set {GPU_MEMORY_ENV} to the real ones",
            setting="parallel_mode")
    return (f"the memory plan says these settings do not fit: {what} (headroom "
            f"{g.headroom_gib:+.1f} GiB; GPU sizes: {source}); expect an out-of-memory failure at this size. "
            f"To fit: {FIX}, or ask for a smaller size or fewer frames")


def _load_gib(g: GpuPlan) -> float:
    """What a GPU holds from the start, before any request: the resident phase and the CUDA context."""
    return g.phases.get("resident", 0.0) + g.outside_gib


def _layout(p: MemoryPlan) -> str:
    flags = " ".join(p.spec.flags()[1:])
    return f"this layout ({flags})" if flags else "one GPU without offload"
