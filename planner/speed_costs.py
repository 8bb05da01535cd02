"""Expected engine time of a configuration relative to one GPU without offload: what orders the ladder.

`build_ladder` (planner/ladder.py) sorts its rungs (stably) by `speed_cost`, so "fastest that
fits" follows measured costs rather than a fixed order. The numbers, and the runs they come
from, are beside `SPEED_COSTS`; `cost_text` is how a rung's speed note says it.

CFG parallel splits the two CFG branches over two GPUs, so its speed depends on the guidance
the jobs run: `cfg_runs` is the one place that decides whether a job runs CFG, and the
planner (`speed_cost`, the ladder, `resolve_launch`), the launch warnings and Generate Video's
note (`idle_cfg_warning`) all ask it.
"""
from __future__ import annotations

from typing import Optional

from ..server.spec import LaunchSpec

# Expected engine time of one job, relative to one GPU without offload or tiling (lower is faster).
# Measured with the real vLLM-Omni 0.26 server on H200s (bench/results/h200-comfyui-e2e-vllm-omni-0.26/
# B/calibration.json: TI2V-5B 1280x704x121, 4 steps, --enforce-eager, --vae-use-tiling each):
#   engine time 33.5 s tiled / 32.2 s + layerwise / 44.1 s + module; s/step 2.42 / 2.42 / 2.48.
#   Layerwise offload streams blocks behind the compute: no slower (-4% measured, counted as 0).
#   Module offload swaps the text encoder and the DiT in and out every request: +32%.
#   Tiling leaves s/step unchanged (2.42 untiled and tiled); its cost is decode time only, a few
#   seconds per job (counted as 0: the untiled rung is always tried first at each configuration).
# Parallel modes, per step on 2 H200s (docs/upstream-facts.md, "H200 measurements"): CFG parallel 2
# 1.98x, Ulysses 2 1.91x. Unmeasured, placed by what they add: HSDP gathers every block (+10%),
# tensor parallel all-reduces every layer (1.5x assumed, behind HSDP).
SPEED_COSTS: dict[str, float] = {
    "offload_none": 1.0, "offload_layerwise": 1.0, "offload_module": 1.32,
    "tiling": 1.0,
    "parallel_none": 1.0, "parallel_cfg": 1 / 1.98, "parallel_ulysses": 1 / 1.91,
    "parallel_ring": 1 / 1.91, "parallel_tensor": 1 / 1.5, "hsdp": 1.10,
}


def cfg_runs(guidance: Optional[float], guidance_2: Optional[float] = None) -> bool:
    """Whether a job runs classifier-free guidance (a negative branch), from the guidance values
    as sent (None: not sent).

    vLLM-Omni's Wan2.2 pipelines (0.26 and 0.30, `pipeline_wan2_2*.py`) run the negative branch
    only when `guidance_low > 1.0 or guidance_high > 1.0`: a request without guidance_scale gets
    the pipeline's default (4.0: CFG on), one without guidance_scale_2 uses guidance_scale for
    both A14B experts. So CFG is off only when every expert's guidance is at most 1 (the 4-step
    distill LoRAs), and then CFG parallel leaves its second GPU idle.
    """
    if guidance is None:
        return True
    return guidance > 1.0 or (guidance_2 is not None and guidance_2 > 1.0)


def idle_cfg_warning(spec: LaunchSpec, cfg: bool) -> str:
    """What to tell the user when `spec` is CFG parallel and the jobs run no CFG ("" otherwise):
    the widget to change and the better choice."""
    if cfg or spec.parallel.mode != "cfg":
        return ""
    return ("CFG parallel does nothing at guidance 1 (no CFG): upstream runs the one branch and the second GPU "
            "idles. Set Serving Config's parallel_mode to ulysses (or ring / tensor; CLI: --parallel ulysses=2), "
            "or to auto, which plans for the guidance the job runs")


def speed_cost(spec: LaunchSpec, cfg: bool = True) -> float:
    """Expected engine time of `spec` relative to one GPU without offload (from `SPEED_COSTS`),
    for jobs that run CFG (`cfg`, see `cfg_runs`) or not: without CFG, CFG parallel runs at the
    speed of one GPU while holding two."""
    p, m = spec.parallel, spec.memory
    mode = "none" if p.mode == "cfg" and not cfg else p.mode
    cost = SPEED_COSTS[f"offload_{m.offload}"] * SPEED_COSTS.get(f"parallel_{mode}", 1.0)
    if p.hsdp or p.mode == "hsdp":
        cost *= SPEED_COSTS["hsdp"]
    if m.vae_tiling:
        cost *= SPEED_COSTS["tiling"]
    return cost


def cost_text(cost: float) -> str:
    """`cost` as the short sentence a rung's speed note ends with."""
    pct = round((cost - 1.0) * 100)
    if pct == 0:
        return "about the engine time of 1 GPU without offload"
    if cost < 1.0:
        return f"about {1 / cost:.2f}x faster than 1 GPU without offload"
    return f"about {pct:+d}% engine time against 1 GPU without offload"
