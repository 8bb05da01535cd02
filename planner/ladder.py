"""Pick the fastest configuration that fits (the ladder; planner/step_down.py walks it after a failure).

The ladder, fastest first (every rung is a LaunchSpec that passes `spec.validate()`):

1. A parallel mode over all the GPUs without offload, each with VAE patch parallel = the degree (a
   tiled decode spread over the GPUs) and without it (an untiled decode on each GPU, faster per clip
   but more memory): with CFG on and 2 GPUs, CFG parallel (H200: 1.98x per step,
   docs/upstream-facts.md) before Ulysses (1.91x); with CFG off (guidance 1, or a step-distilled
   model, which never runs CFG), Ulysses (CFG parallel would leave a GPU idle). One GPU: no offload.
2. The same plus HSDP (DiT weights sharded over the GPUs, gathered block by block), then tensor
   parallel (DiT split; text encoder replicated; HSDP and TP exclude each other), at a degree that
   splits both the attention heads and the feed-forward width evenly
   (spec_rules.tensor_parallel_degrees: not on 3 GPUs).
3. Module CPU offload (text encoder and DiT experts take turns on the GPU) with the parallel
   modes above, which still beats one GPU; then one GPU without offload.
4. Layerwise offload (DiT blocks streamed from host RAM) on one GPU, single-card only upstream
   (measured no slower per step on an H200), then module offload on one GPU.
5. FP8 only when asked (`allow_fp8=True`), then last, with a warning: vLLM-Omni's feature
   table marks Wan2.2 quantization unsupported and its FP8 docs list no Wan model, so a
   quality loss would be silent. Memory is better bought with offload, which is exact.
   With `speed` "fast" (Serving Config), the levers measured faster on the server's line
   (speed_costs.fast_levers: FP8 on 0.30) join every rung and are ranked by cost instead.
6. Nothing fits: the largest frame count any rung fits at the request's size (the fastest of the
   rungs that fit that many), then the largest frame size. Nothing fits at all: FP8 stays off, but
   the answer names the FP8 configuration the same walk with FP8 allowed finds
   (recommendation.fp8_way_out), or says even FP8 does not fit; where host RAM alone is the limit,
   the answer says so with its figures.

One-GPU rungs run on the GPU with the most memory (mixed sizes: 24,141 runs on the 141).
VAE tiling is tried at each one-GPU rung (without, then with) instead of only at the end.

The order is not fixed: the rungs are sorted (stably) by their expected engine time relative to
one GPU without offload, measured per vLLM-Omni line (planner/speed_costs.py: the numbers and
where they come from), for the line the server runs (`server_version`; the pinned 0.30 when not
given; the memory estimates follow the same line, planner/calibration.py). On 0.26 offload is what
costs (module +32% engine time, layerwise nothing, tiling a few seconds), so tiling comes first; on
0.30 the tiled decode is what costs (about 4x the untiled one: +15 s a clip at 1280x704x121, where
layerwise offload costs under a second), so untiled rungs, VAE patch off included, usually come
first. Either way a parallel mode with offload comes before one GPU without it.

What a walk answers, the rungs and the recommendation, is in planner/recommendation.py.

Two GPUs without peer-to-peer access (or two GeForce cards where it is unknown) reorder the ladder:
planner/peer_links.py owns that policy.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Optional, Sequence, Union

from ..errors import LauncherError, SpecError
from ..models import WanFamily
from ..server.launch.flags import Version
from ..server.launch.spec import LaunchSpec, MemoryConfig, ParallelConfig
from ..server.launch.spec_rules import tensor_parallel_degrees
from .gpus import GpuInfo, hypothetical_gpus, load_nvml, peer_status, query_gpus
from .memory import plan
from .memory_plan import MemoryPlan
from .model_sizes import ModelSizes, model_sizes
from .peer_links import PeerLinks, p2p_links
from .recommendation import Recommendation, Rung, fp8_way_out
from .request_shape import RequestShape
from .speed_costs import FAST_NOT_CHOSEN, cost_text, family_runs_cfg, fast_levers, speed_cost

GpuArg = Union[None, Sequence[GpuInfo], Sequence[float]]
# where something fits; where nothing does, the answer says what FP8 would fit instead (`recommend`)
FP8_SKIPPED = ("FP8 is skipped (upstream marks Wan2.2 quantization unvalidated); pass allow_fp8 / --allow-fp8 "
               "to add it as the last resort")


def _gpu_list(gpus: GpuArg, nvml: Any = None) -> tuple[list[GpuInfo], str, Optional[bool], list[str]]:
    """(GPUs, source, all pairs have P2P (None unknown), notes)."""
    notes: list[str] = []
    if gpus is None:
        found, reason = query_gpus(nvml)
        if not found:
            raise LauncherError("Cannot recommend a configuration without knowing the GPUs",
                                reason or "NVML found no GPU",
                                "give the GPU sizes, e.g. --gpu-memory 24,24 (CLI) or gpus=[24, 24] (API)",
                                setting="gpu_memory")
        p2p: Optional[bool] = None
        if len(found) > 1:
            mod, _ = load_nvml(nvml)
            if mod is not None:
                try:
                    pairs = peer_status(mod, found)
                    states = [pr["p2p_read"] for pr in pairs]
                    p2p = all(s == "ok" for s in states) if all(s in ("ok", "not supported") for s in states) else None
                except Exception:
                    p2p = None
                finally:
                    try:
                        mod.nvmlShutdown()
                    except Exception:
                        pass
        return found, "NVML", p2p, notes
    if gpus and isinstance(gpus[0], (int, float)):
        return hypothetical_gpus([float(g) for g in gpus]), "given sizes", None, notes   # type: ignore[arg-type]
    return list(gpus), "given GPUs", None, notes   # type: ignore[arg-type]


def _with(base: LaunchSpec, gpus: Optional[tuple[int, ...]], parallel: ParallelConfig,
          memory: MemoryConfig) -> LaunchSpec:
    return replace(base, gpus=gpus, parallel=parallel, memory=memory)


def build_ladder(base: LaunchSpec, gpus: Sequence[GpuInfo], request: RequestShape, *,
                 p2p: Optional[bool] = None, links: Optional[PeerLinks] = None, allow_fp8: bool = False,
                 server_version: Optional[Version] = None, speed: str = "exact") -> tuple[list[Rung], list[str]]:
    """Every rung for these GPUs, fastest first (by the speed costs of `server_version`'s line), and
    notes on the order chosen. `speed` "fast": the levers `fast_levers` names for that line (measured faster,
    output not identical) join every rung and are ranked by cost with the rest, instead of FP8 coming last.
    `links`: the GPUs' links when the caller has them already (`recommend` uses them again when the request
    must shrink); else they come from `p2p`."""
    family = base.family
    notes: list[str] = []
    n = len(gpus)
    ids = tuple(g.index for g in gpus)
    # one GPU: the roomiest (mixed sizes: 24,141 runs on the 141), first of equals
    one = (max(gpus, key=lambda g: g.available_gib).index,) if n > 1 else (
        base.gpus if base.gpus is not None and len(base.gpus) == 1 else None)
    keep_mem = dict(vae_slicing=False)
    links = links if links is not None else p2p_links(gpus, p2p)
    rungs: list[Rung] = []

    def add(spec: LaunchSpec, label: str, speed: str, tiling_variant: bool = True) -> None:
        rungs.append(Rung(spec, label, speed))
        if tiling_variant and not spec.memory.vae_tiling and spec.parallel.vae_patch <= 1:
            tiled = replace(spec, memory=replace(spec.memory, vae_tiling=True))
            rungs.append(Rung(tiled, label + " + VAE tiling", speed + "; tiled VAE decode (a slower decode)"))

    multi: list[tuple[ParallelConfig, str, str]] = []
    if n >= 2:
        deg = n
        uly_mode = "strict" if family.attention_heads % deg == 0 else "advanced_uaa"
        at = "" if deg == 2 else f"; measured at 2 GPUs only, counted as 2-way at {deg}"
        modes = [(ParallelConfig("ulysses", deg, ulysses_mode=uly_mode), f"Ulysses {deg}",
                  "about 1.8-1.9x per step (all-to-all every layer)" + at)]
        if family_runs_cfg(family, request.cfg) and n == 2:
            modes.insert(0, (ParallelConfig("cfg", 2), "CFG parallel 2",
                             "about 1.9-2x per step (one CFG branch per GPU)"))
        modes += [(replace(pc, hsdp=True), lbl + " + HSDP", spd + "; weights gathered per block (slower)")
                  for pc, lbl, spd in modes]     # HSDP overlays these, never TP (spec_rules)
        if deg in tensor_parallel_degrees(family, deg):   # 3 GPUs: no even split of the heads (spec_rules)
            modes.append((ParallelConfig("tensor", deg), f"tensor parallel {deg}",
                          "DiT split; an all-reduce per layer (speed unmeasured for Wan)"))
        # each mode with VAE patch parallel (a tiled decode spread over the GPUs) and without (untiled): which
        # is faster depends on the size (speed_costs), and the untiled decode needs more memory per GPU
        for pc, lbl, spd in modes:
            multi.append((replace(pc, vae_patch=deg), f"{lbl} + VAE patch {deg}", spd))
            multi.append((pc, f"{lbl} + untiled VAE decode", spd + "; untiled VAE decode on each GPU"))
        notes += links.notes(family_runs_cfg(family, request.cfg))
        for pc, lbl, spd in multi:
            add(_with(base, ids, pc, MemoryConfig(**keep_mem)), lbl, spd, tiling_variant=False)
    # one GPU, no offload
    add(_with(base, one, ParallelConfig(), MemoryConfig(**keep_mem)), "1 GPU, no offload",
        "baseline speed" if n == 1 else "1 GPU (the other idle)")
    # module offload: with each multi-GPU mode, then on one GPU
    for pc, lbl, spd in multi:
        if pc.hsdp:
            continue
        add(_with(base, ids, pc, MemoryConfig(offload="module", **keep_mem)), lbl + " + module offload",
            spd + "; text encoder and experts swapped over PCIe", tiling_variant=False)
    add(_with(base, one, ParallelConfig(), MemoryConfig(offload="module", **keep_mem)),
        "1 GPU + module offload", "text encoder and experts swapped over PCIe (seconds per request)")
    add(_with(base, one, ParallelConfig(), MemoryConfig(offload="layerwise", **keep_mem)),
        "1 GPU + layerwise offload", "DiT blocks streamed from host RAM behind the compute (single-card only)")
    fast = dict(fast_levers(server_version)) if speed == "fast" else {}
    if "fp8" in fast:
        for r in list(rungs):
            rungs.append(Rung(replace(r.spec, memory=replace(r.spec.memory, quantization="fp8")), r.label + " + FP8",
                              r.speed + "; FP8 DiT weights", warnings=["speed fast: " + fast["fp8"]]))
        notes.append(f"speed fast: {fast['fp8']}; {FAST_NOT_CHOSEN}")
    elif speed == "fast":
        notes.append("speed fast: no lever was measured faster on this vLLM-Omni line, so the plan is exact's; "
                     + FAST_NOT_CHOSEN)
    costs = {id(r): speed_cost(r.spec, request.cfg, request, server_version=server_version) for r in rungs}
    rungs.sort(key=lambda r: costs[id(r)])   # stable: ties keep the order above
    for r in rungs:
        r.speed += f"; {cost_text(costs[id(r)])}"
    rungs.sort(key=links.group)   # stable: keeps the speed order inside each group
    if allow_fp8 and not fast:
        for r in list(rungs):
            if r.spec.memory.vae_tiling or r.spec.parallel.vae_patch > 1:
                fp8 = replace(r.spec, memory=replace(r.spec.memory, quantization="fp8"))
                rungs.append(Rung(fp8, r.label + " + FP8", r.speed + "; FP8 DiT weights (unvalidated for Wan2.2)",
                                  warnings=["FP8 is not validated for Wan2.2 upstream: compare against bf16"]))
        notes.append("FP8 rungs come last: vLLM-Omni marks Wan2.2 quantization unvalidated")
    elif not fast:
        notes.append(FP8_SKIPPED)
    # drop invalid and duplicate rungs
    out: list[Rung] = []
    seen: set[str] = set()
    for r in rungs:
        key = r.spec.fingerprint()
        if key in seen:
            continue
        seen.add(key)
        try:
            r.warnings += r.spec.validate(visible_gpus=None if gpus and gpus[0].hypothetical else
                                          max(g.index for g in gpus) + 1 if gpus else None)
        except SpecError as exc:
            r.fits, r.why_not = False, f"not a valid configuration: {exc.what}"
            continue
        r.warnings += [w for w in (links.warning(r),) if w]
        out.append(r)
    return out, notes


def _why_not(p: MemoryPlan) -> str:
    parts = []
    for g in p.gpus:
        if g.fits is False and g.gpu is not None:
            parts.append(f"GPU {g.gpu.index} needs {g.peak_gib:.1f} GiB at {g.peak_phase} (+{g.margin_gib:.1f} margin) "
                         f"but has {g.gpu.available_gib:.1f}")
    if p.host_ram.get("ok") is False:
        parts.append(f"host RAM needs {p.host_ram['needed_gib']:.0f} GiB, {p.host_ram['available_gib']:.0f} available")
    return "; ".join(parts) or "does not fit"


def evaluate_rung(r: Rung, request: RequestShape, gpus: Sequence[GpuInfo], sizes: ModelSizes,
                  host_available_gib: Optional[float], server_version: Optional[Version] = None) -> Rung:
    """`r` with its plan, fit and reason for `request` (in place: the rung now speaks of this request),
    estimated with `server_version`'s coefficients."""
    used = [g for g in gpus if r.spec.gpus is None or g.index in r.spec.gpus] or list(gpus)
    r.plan = plan(r.spec, request, used, sizes=sizes, host_available_gib=host_available_gib,
                  server_version=server_version)
    r.fits = bool(r.plan.fits)
    r.why_not = "" if r.fits else _why_not(r.plan)
    return r


def _tried_at(r: Rung, request: RequestShape, gpus: Sequence[GpuInfo], sizes: ModelSizes,
              host_available_gib: Optional[float], server_version: Optional[Version]) -> Rung:
    """A copy of `r` evaluated for a smaller `request`: the rung itself keeps its plan and reason
    for the request asked, which is the one its "not X" line is printed under."""
    return evaluate_rung(replace(r, plan=None, fits=None, why_not="", warnings=list(r.warnings)), request, gpus,
                         sizes, host_available_gib, server_version)


def _max_frames(spec: LaunchSpec, request: RequestShape, gpus: Sequence[GpuInfo], sizes: ModelSizes,
                host: Optional[float], server_version: Optional[Version], limit: int = 481,
                above: int = 0) -> Optional[int]:
    """Largest 4k+1 frame count up to `limit` that fits at the request's size, if it is more than `above`
    (None if it is not, or even 1 frame does not fit). The memory a plan needs grows with the frames, so a
    rung that does not fit the first count above `above` fits none: one plan answers it."""
    used = [g for g in gpus if spec.gpus is None or g.index in spec.gpus] or list(gpus)

    def ok(frames: int) -> bool:
        return bool(plan(spec, replace(request, frames=frames), used, sizes=sizes, host_available_gib=host,
                         server_version=server_version).fits)

    lo, hi = max(0, above + 3) // 4, (limit - 1) // 4     # 4*lo+1: the first count above `above`
    if lo > hi or not ok(4 * lo + 1):
        return None
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if ok(4 * mid + 1):
            lo = mid
        else:
            hi = mid - 1
    return 4 * lo + 1


def _nothing_fits(rungs: Sequence[Rung]) -> str:
    """Why nothing fits: host RAM, with its figures and what to change, when it is the only limit of some rung
    (its GPUs fit); else the model's weights on these GPUs."""
    ram_only = [r for r in rungs if r.plan is not None and r.plan.host_ram.get("ok") is False
                and all(g.fits is not False for g in r.plan.gpus)]
    if ram_only:
        r = min(ram_only, key=lambda r: r.plan.host_ram["needed_gib"])   # type: ignore[union-attr]
        host = r.plan.host_ram   # type: ignore[union-attr]
        return (f"host RAM is the limit: the GPUs would fit {r.label}, but its offloaded weights need "
                f"{host['needed_gib']:.0f} GiB of host RAM and {host['available_gib']:.0f} GiB is available; free "
                "host RAM (close other programs or servers); `plan --host-ram GB` plans for a machine with more")
    return ("even the leanest configuration (layerwise offload, tiled VAE) does not fit these GPUs; the model's "
            "weights are the limit")


def _smaller_sizes(family: WanFamily, request: RequestShape) -> list[tuple[int, int]]:
    m = family.size_multiple
    out = []
    for pct in range(90, 20, -10):
        w = max(m, request.width * pct // 100 // m * m)
        h = max(m, request.height * pct // 100 // m * m)
        if (w, h) not in out and (w, h) != (request.width, request.height):
            out.append((w, h))
    return out


def recommend(model: Union[str, LaunchSpec], request: Optional[RequestShape] = None, gpus: GpuArg = None, *,
              p2p: Optional[bool] = None, allow_fp8: bool = False, host_available_gib: Optional[float] = -1.0,
              nvml: Any = None, min_frames: int = 17, server_version: Optional[Version] = None,
              speed: str = "exact") -> Recommendation:
    """The fastest configuration that fits `request` on `gpus`.

    model: an HF id / local folder, or a LaunchSpec whose non-memory settings (host, port,
    runtime switches, extra flags, and its GPU selection) are kept.
    gpus: None (NVML: this machine), GpuInfo list, or sizes in GiB such as [24, 24].
    p2p: whether the GPUs have peer-to-peer access (None: NVML when real, else unknown).
    server_version: the vLLM-Omni line that will serve (its memory and speed figures); None: the pinned
    default, and the recommendation says so.
    speed: "exact" (the default) or "fast" (`build_ladder`: measured-faster levers whose output differs).
    """
    v = server_version
    base = model if isinstance(model, LaunchSpec) else LaunchSpec(model=model)
    family = base.family
    asked = request or RequestShape.default_for(family)
    gpu_list, source, nvml_p2p, notes = _gpu_list(gpus, nvml)
    if base.gpus is not None and not (gpu_list and gpu_list[0].hypothetical):
        chosen = [g for g in gpu_list if g.index in base.gpus]
        if len(chosen) != len(base.gpus):
            raise LauncherError(f"GPU {sorted(set(base.gpus) - {g.index for g in gpu_list})} is not on this machine",
                                f"NVML lists {len(gpu_list)} GPU(s)", "pick existing GPU ids or 'all'",
                                setting="gpus")
        gpu_list = chosen
    p2p = p2p if p2p is not None else nvml_p2p
    links = p2p_links(gpu_list, p2p)
    sizes = model_sizes(base.model)
    rungs, ladder_notes = build_ladder(base, gpu_list, asked, links=links, allow_fp8=allow_fp8, server_version=v,
                                       speed=speed)
    notes += ladder_notes
    rejected: list[Rung] = []
    for r in rungs:
        evaluate_rung(r, asked, gpu_list, sizes, host_available_gib, v)
        if r.fits:
            faster = len(rejected)
            reason = (f"the fastest of {len(rungs)} configurations that fits" if faster == 0 else
                      f"fits with {r.plan.min_headroom_gib:.1f} GiB to spare; the {faster} faster "
                      f"configuration{'s' if faster > 1 else ''} below do{'' if faster > 1 else 'es'} not fit")
            if faster == 0:
                reason += f" ({r.plan.min_headroom_gib:.1f} GiB to spare on the tightest GPU)"
            return Recommendation(spec=r.spec, request=asked, asked=asked, plan=r.plan, label=r.label,
                                  reason=reason, rejected=rejected, notes=notes + r.plan.notes,
                                  warnings=list(r.warnings),
                                  max_frames=_max_frames(r.spec, asked, gpu_list, sizes, host_available_gib, v),
                                  gpus=gpu_list, speed=r.speed, server_version=v)
        rejected.append(r)
    # nothing fits the request as asked: the most frames any rung fits (the fastest of those that fit as many),
    # preferring the rungs the links allow (peer_links.tiers), then smaller frames. Each rung is searched only
    # above the best so far (at least min_frames): a slower rung must fit more frames to win
    tiers = links.tiers(rungs)
    for tier in tiers:
        most: Optional[tuple[int, Rung]] = None
        for r in tier:
            floor = most[0] if most is not None else min(min_frames, asked.frames) - 1
            mf = _max_frames(r.spec, asked, gpu_list, sizes, host_available_gib, v, limit=asked.frames, above=floor)
            if mf is not None:
                most = (mf, r)
        if most is not None:
            mf, req = most[0], replace(asked, frames=most[0])
            fit = _tried_at(most[1], req, gpu_list, sizes, host_available_gib, v)
            return Recommendation(spec=fit.spec, request=req, asked=asked, plan=fit.plan, label=fit.label,
                                  reason=f"nothing fits {asked.frames} frames at {asked.width}x{asked.height}; "
                                         f"this configuration fits the most frames there ({mf}; any faster one "
                                         "fits fewer" + ("" if len(tiers) == 1 else ", or needs the peer-to-peer "
                                                         "access these GPUs lack") + ")",
                                  rejected=rejected, notes=notes + fit.plan.notes, warnings=list(fit.warnings),
                                  max_frames=mf, gpus=gpu_list, speed=fit.speed, server_version=v)
    for w, h in _smaller_sizes(family, asked):
        smaller = replace(asked, width=w, height=h)
        for r in rungs:
            fit = _tried_at(r, smaller, gpu_list, sizes, host_available_gib, v)
            if fit.fits:
                return Recommendation(spec=fit.spec, request=smaller, asked=asked, plan=fit.plan, label=fit.label,
                                      reason=f"nothing fits {asked.width}x{asked.height}; {w}x{h} is the largest "
                                             "size (same frames) that fits",
                                      rejected=rejected, notes=notes + fit.plan.notes, warnings=list(fit.warnings),
                                      max_frames=_max_frames(fit.spec, smaller, gpu_list, sizes, host_available_gib, v),
                                      gpus=gpu_list, speed=fit.speed, server_version=v)
    leanest = rungs[-1] if rungs else None
    none = Recommendation(spec=None, request=asked, asked=asked, plan=leanest.plan if leanest else None,
                          label="none", reason=_nothing_fits(rungs), rejected=rejected,
                          notes=[n for n in notes if n != FP8_SKIPPED], gpus=gpu_list, server_version=v)
    # Nothing fits: the same walk with FP8 allowed says which FP8 configuration would (FP8 stays opt-in)
    fp8_tried = any(r.spec.memory.quantization == "fp8" for r in rungs)
    none.way_out, none.fp8_fits = fp8_way_out(none if fp8_tried else recommend(
        base, asked, gpu_list, p2p=p2p, allow_fp8=True, host_available_gib=host_available_gib,
        min_frames=min_frames, server_version=v, speed=speed))
    return none
