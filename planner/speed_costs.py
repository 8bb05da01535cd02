"""Expected engine time of a configuration relative to one GPU without offload: what orders the ladder.

`build_ladder` (planner/ladder.py) sorts its rungs (stably) by `speed_cost`, so "fastest that
fits" follows measured costs rather than a fixed order. `fast_levers` names the levers that change
the output (FP8) but were measured faster, which Serving Config's `speed` fast lets the ladder use.
Per vLLM-Omni line: 0.30's costs are seconds in parts (`JobTimes`: denoise per step, text encode,
VAE decode untiled or tiled, the FP8 and compile factors), so they depend on the request's size
and step count; 0.26's are the fixed factors of `SPEED_COSTS`. The numbers, and the runs they
come from, are beside each; `cost_text` is how a rung's speed note says it.

CFG parallel splits the two CFG branches over two GPUs, so its speed depends on the guidance
the jobs run: `cfg_runs` is the one place that decides whether a job runs CFG, and the
planner (`speed_cost`, the ladder, `resolve_launch`), the launch warnings and Generate Video's
note (`idle_cfg_warning`) all ask it.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

from ..models import WanFamily
from ..server.launch.flags import Version
from ..server.launch.spec import LaunchSpec, MemoryConfig, ParallelConfig
from .calibration import calibrated_line
from .request_shape import RequestShape

# vLLM-Omni 0.26: expected engine time of one job, relative to one GPU without offload or tiling (lower is faster).
# Measured with the real vLLM-Omni 0.26 server on H200s (bench/results/h200-comfyui-e2e-vllm-omni-0.26/
# B/calibration.json: TI2V-5B 1280x704x121, 4 steps, --enforce-eager, --vae-use-tiling each):
#   engine time 33.5 s tiled / 32.2 s + layerwise / 44.1 s + module; s/step 2.42 / 2.42 / 2.48.
#   Layerwise offload streams blocks behind the compute: no slower (-4% measured, counted as 0).
#   Module offload swaps the text encoder and the DiT in and out every request: +32%.
#   Tiling leaves s/step unchanged (2.42 untiled and tiled); its cost is decode time only, a few
#   seconds per job (counted as 0: the untiled rung is always tried first at each configuration).
# Parallel modes, per step on 2 H200s (docs/upstream-facts.md, "H200 measurements"): CFG parallel 2
# 1.98x, Ulysses 2 1.91x. Unmeasured, placed by what they add: HSDP gathers every block (+10%),
# tensor parallel all-reduces every layer (1.5x assumed, behind HSDP). Every factor is for degree 2,
# the only degree measured: Ulysses/ring/TP over 3 or more GPUs are counted with the 2-way factor (no
# gain assumed for the extra GPUs; the ladder's speed note says so).
SPEED_COSTS: dict[str, float] = {
    "offload_none": 1.0, "offload_layerwise": 1.0, "offload_module": 1.32,
    "tiling": 1.0,
    "parallel_none": 1.0, "parallel_cfg": 1 / 1.98, "parallel_ulysses": 1 / 1.91,
    "parallel_ring": 1 / 1.91, "parallel_tensor": 1 / 1.5, "hsdp": 1.10,
}


@dataclass(frozen=True)
class JobTimes:
    """vLLM-Omni 0.30's job time in parts, MEASURED on one H200 through our Supervisor (TI2V-5B full size,
    eager, CFG on, 4 steps; bench/results/h200-memory-vllm-omni-0.30/): the parts add up, so VAE tiling
    (seconds per clip) and offload (a per-step factor and seconds per job) rank by what they really cost
    at the request's size and step count rather than by a fixed factor."""

    step_s_per_token: float = 3.67e-5      # s/step = a*T + b*T^2 (T tokens): 0.37 s at 8,190, 1.77 at 27,280
    step_s_per_token2: float = 1.03e-9
    decode_s_per_mpx_frame: float = 0.040  # untiled VAE decode: 4.3 s for 1280x704x121 (109 Mpx x frames)
    tiled_decode_s_per_mpx_frame: float = 0.17   # tiled: 17.9-19.4 s there, 6-9 s at 832x480x81
    offload_step: tuple[tuple[str, float], ...] = (("none", 1.0), ("layerwise", 1.006), ("module", 1.04))
    text_encode_s: tuple[tuple[str, float], ...] = (("none", 0.1), ("layerwise", 0.34), ("module", 0.56))
    # the rest of a job's difference to no offload (14.11 / 14.69 s against 13.36 s at 1280x704x121, 4 steps):
    # layerwise's first blocks in, module's DiT swapped in for the denoise (over the H200's PCIe Gen5; a
    # slower bus costs more)
    offload_job_s: tuple[tuple[str, float], ...] = (("none", 0.0), ("layerwise", 0.4), ("module", 0.6))
    no_cfg_step: float = 0.5               # one branch per step instead of two
    # The speed levers, per step against eager bf16 (bench/results/h200-levers-vllm-omni-0.30/: TI2V-5B
    # 1280x704x121, 20 steps, one H200): FP8 DiT weights (online per-tensor, CUTLASS) 1.619 s against 1.763
    # (and 4.3 GiB less at peak); torch.compile (upstream's regional compile) 1.664; both 1.479 (0.839,
    # a little better than the product). cache-dit skipped no step on random weights (1.767): no measured
    # gain, so it stays 1.0 and `speed` fast does not pick it. The attention backends the kit has are all
    # slower than the default FLASH_ATTN (cuDNN 2.00, SDPA 2.52 s/step): the default stays.
    fp8_step: float = 0.918
    compile_step: float = 0.944

    def parts(self, spec: LaunchSpec, request: RequestShape, steps: int, cfg: bool) -> tuple[float, float]:
        """(denoise seconds on one GPU, the rest: text encode + VAE decode) of one job with `spec`'s memory
        settings; VAE patch parallel spreads the (tiled) decode over its ranks."""
        tokens = request.tokens(spec.family)
        step = (self.step_s_per_token * tokens + self.step_s_per_token2 * tokens ** 2) * (1.0 if cfg else self.no_cfg_step)
        step *= dict(self.offload_step)[spec.memory.offload]
        step *= (self.fp8_step if spec.memory.quantization == "fp8" else 1.0) * \
            (1.0 if spec.runtime.enforce_eager else self.compile_step)
        mpx_frames = request.width * request.height * request.frames * request.batch / 1e6
        patch = spec.parallel.vae_patch if spec.parallel.world_size > 1 else 1
        tiled = spec.memory.vae_tiling or patch > 1
        decode = mpx_frames * (self.tiled_decode_s_per_mpx_frame if tiled else self.decode_s_per_mpx_frame) / patch
        off = spec.memory.offload
        return steps * step, dict(self.text_encode_s)[off] + dict(self.offload_job_s)[off] + decode


JOB_TIMES_0_30 = JobTimes()


# What `speed` fast may add to a configuration (Serving Config / `--speed fast`), per vLLM-Omni line: only the
# levers MEASURED faster on that line, each with the sentence the plan says about it. The output differs from
# `exact` (FP8 rounds the DiT weights); cache-dit is not among them until a run with real weights shows a gain.
FAST_LEVERS: dict[Version, tuple[tuple[str, str], ...]] = {
    # T2V-A14B on an H100 (bench/results/h100-a14b-native-vs-ours-fast-lora-vllm-omni-0.30/, both compiled):
    # 4.47 s/step against 5.11 and a 47.8 GiB server peak against 72.8, close to `fp8_step` x compile's 0.889.
    (0, 30): (("fp8", "FP8 DiT weights (measured on vLLM-Omni 0.30: 8% faster per step and 4.3 GiB less for "
                      "TI2V-5B on an H200, 12% faster and 25 GiB less for T2V-A14B on an H100; the frames differ "
                      "from bf16's and upstream has not validated Wan2.2 quantization)"),),
}
FAST_NOT_CHOSEN = ("cache-dit is not chosen: it skipped no step in the measured run (random weights), so its "
                   "gain is unknown")


def fast_levers(server_version: Optional[Version] = None) -> tuple[tuple[str, str], ...]:
    """The levers `speed` fast uses on `server_version`'s line (the pinned default when None): (name, why)."""
    return FAST_LEVERS.get(calibrated_line(server_version), ())


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


def family_runs_cfg(family: WanFamily, cfg: bool) -> bool:
    """Whether a job of `family` runs CFG, given `cfg` (`cfg_runs` of its guidance): never for the
    step-distilled ("dmd") pipelines, whose server forces guidance 1 and drops the negative prompt
    whatever the request sends (vLLM-Omni 0.30 dmd2/mixin.py: do_classifier_free_guidance = False)."""
    return cfg and family.pipeline != "dmd"


def idle_cfg_warning(spec: LaunchSpec, cfg: bool) -> str:
    """What to tell the user when `spec` is CFG parallel and the jobs run no CFG ("" otherwise):
    the widget to change and the better choice."""
    if cfg or spec.parallel.mode != "cfg":
        return ""
    return ("CFG parallel does nothing at guidance 1 (no CFG): upstream runs the one branch and the second GPU "
            "idles. Set Serving Config's parallel_mode to ulysses (or ring / tensor; CLI: --parallel ulysses=2), "
            "or to auto, which plans for the guidance the job runs")


def speed_cost(spec: LaunchSpec, cfg: bool = True, request: Optional[RequestShape] = None,
               steps: Optional[int] = None, server_version: Optional[Version] = None) -> float:
    """Expected engine time of `spec` relative to one GPU without offload or tiling, for jobs that run CFG
    (`cfg`, see `cfg_runs`) or not: without CFG, CFG parallel runs at the speed of one GPU while holding two.

    0.30 (the default line): `JOB_TIMES_0_30` at `request` (default: the family's size) and `steps` (default:
    the family's), the parallel factors on the denoise loop only, so a tiled decode costs what it costs at
    that size; before 0.30: the factors in `SPEED_COSTS`."""
    p, m = spec.parallel, spec.memory
    cfg = family_runs_cfg(spec.family, cfg)
    mode = "none" if p.mode == "cfg" and not cfg else p.mode
    parallel = SPEED_COSTS.get(f"parallel_{mode}", 1.0) * (SPEED_COSTS["hsdp"] if p.hsdp or p.mode == "hsdp" else 1.0)
    if calibrated_line(server_version) < (0, 30):
        return SPEED_COSTS[f"offload_{m.offload}"] * parallel * (SPEED_COSTS["tiling"] if m.vae_tiling else 1.0)
    req = request or RequestShape.default_for(spec.family)
    n = steps or spec.family.steps
    denoise, rest = JOB_TIMES_0_30.parts(spec, req, n, cfg)
    base = sum(JOB_TIMES_0_30.parts(replace(spec, parallel=ParallelConfig(), memory=MemoryConfig()), req, n, cfg))
    return (denoise * parallel + rest) / base


def cost_text(cost: float) -> str:
    """`cost` as the short sentence a rung's speed note ends with."""
    pct = round((cost - 1.0) * 100)
    if pct == 0:
        return "about the engine time of 1 GPU without offload"
    if cost < 1.0:
        return f"about {1 / cost:.2f}x faster than 1 GPU without offload"
    return f"about {pct:+d}% engine time against 1 GPU without offload"
