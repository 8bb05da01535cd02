"""After a failure (out of memory in one phase, or the GPUs failing to talk), the next leaner spec.

`step_down` walks the ladder that `recommend` builds (planner/ladder.py) from the failing spec
towards its lean end, and takes the first rung whose plan lowers the peak of the phase that
failed; a decode OOM tries VAE tiling first, the cheapest cure. A step never undoes a memory
saving the failing spec already had, and a communication failure moves to a configuration
that needs little or no traffic between the GPUs. Its sentence says what changed and why.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Optional, Sequence

from ..server.launch.flags import Version
from ..server.launch.spec import LaunchSpec, ParallelConfig
from .gpus import hypothetical_gpus
from .ladder import build_ladder, evaluate_rung
from .memory import plan
from .model_sizes import model_sizes
from .recommendation import Rung
from .request_shape import RequestShape

FAILURE_KINDS = ("oom", "oom_load", "oom_denoise", "oom_decode", "oom_encode", "comm")
# A leaner rung must lower the failing peak by at least this much to be worth a relaunch: the
# estimates are good to a few hundred MiB (planner/calibration.py), so a smaller gain is noise,
# and the server would most likely run out of memory again.
MIN_GAIN_GIB = 0.25


def _same_config(a: LaunchSpec, b: LaunchSpec) -> bool:
    return (a.parallel, replace(a.memory, vae_slicing=False)) == (b.parallel, replace(b.memory, vae_slicing=False))


# Module and layerwise offload are alternatives, not steps: which one is leaner depends on the model
# (TI2V-5B: module, the text encoder leaves the GPU; A14B: layerwise), and the plan decides.
_OFFLOAD_ORDER = {"none": 0, "module": 1, "layerwise": 1}


def _tiled(s: LaunchSpec) -> bool:
    return s.memory.vae_tiling or (s.parallel.vae_patch > 1 and s.parallel.world_size > 1)


def _no_regression(old: LaunchSpec, new: LaunchSpec) -> bool:
    """A step down never undoes a memory saving the failing spec already had."""
    if _tiled(old) and not _tiled(new):
        return False
    if _OFFLOAD_ORDER[new.memory.offload] < _OFFLOAD_ORDER[old.memory.offload]:
        return False
    if old.memory.quantization == "fp8" and new.memory.quantization != "fp8":
        return False
    return True


def _describe_change(old: LaunchSpec, new: LaunchSpec) -> str:
    changes = []
    if old.parallel != new.parallel:
        def par(p: ParallelConfig) -> str:
            if p.mode == "none":
                return "one GPU"
            s = {"ulysses": "Ulysses", "cfg": "CFG parallel", "tensor": "tensor parallel", "ring": "ring",
                 "hsdp": "HSDP"}[p.mode] + f" {p.degree}"
            return s + (" + HSDP" if p.hsdp else "") + (f" + VAE patch {p.vae_patch}" if p.vae_patch > 1 else "")
        changes.append(f"parallelism {par(old.parallel)} -> {par(new.parallel)}")
    if old.memory.offload != new.memory.offload:
        changes.append(f"offload {old.memory.offload} -> {new.memory.offload}")
    if old.memory.vae_tiling != new.memory.vae_tiling:
        changes.append("VAE tiling on" if new.memory.vae_tiling else "VAE tiling off")
    if old.memory.quantization != new.memory.quantization:
        changes.append(f"quantization {old.memory.quantization} -> {new.memory.quantization}")
    if old.gpus != new.gpus:
        changes.append(f"GPUs {list(old.gpus) if old.gpus else 'all'} -> {list(new.gpus) if new.gpus else 'all'}")
    return ", ".join(changes) or "no change"


def step_down(spec: LaunchSpec, failure_kind: str, gpus_memory_gb: Sequence[float],
              request_shape: Optional[RequestShape] = None, *, allow_fp8: bool = False,
              host_available_gib: Optional[float] = -1.0,
              server_version: Optional[Version] = None) -> Optional[tuple[LaunchSpec, str]]:
    """The next leaner spec after a failure, and one sentence saying what changed; None at the bottom.

    failure_kind: "oom" (phase unknown), "oom_load" (weights did not fit at startup),
    "oom_denoise", "oom_encode", "oom_decode" (VAE), or "comm" (NCCL / peer-to-peer failure).
    gpus_memory_gb: memory of each GPU the server may use (same order as spec.gpus).
    server_version: the vLLM-Omni line of the server that failed (its memory figures and speed order).
    Keeps everything that is not parallelism or memory (model, port, runtime, extra flags).
    """
    if failure_kind not in FAILURE_KINDS:
        raise ValueError(f"failure_kind must be one of {FAILURE_KINDS}, not {failure_kind!r}")
    request = request_shape or RequestShape.default_for(spec.family)
    gpu_infos = hypothetical_gpus(list(gpus_memory_gb))
    if spec.gpus is not None and len(spec.gpus) == len(gpu_infos):
        gpu_infos = [replace(g, index=i) for g, i in zip(gpu_infos, spec.gpus)]
    sizes = model_sizes(spec.model)
    current = plan(spec, request, [g for g in gpu_infos if spec.gpus is None or g.index in spec.gpus] or gpu_infos,
                   sizes=sizes, host_available_gib=None, server_version=server_version)
    cur_peak = max(g.torch_peak_gib for g in current.gpus)
    cur_phase_peak = {ph: max(g.phases.get(ph, 0.0) for g in current.gpus)
                      for ph in ("resident", "denoise", "decode", "encode")}

    # A decode OOM: tiling is the cheapest cure, before anything else.
    if failure_kind == "oom_decode" and not spec.memory.vae_tiling and spec.parallel.vae_patch <= 1:
        new = replace(spec, memory=replace(spec.memory, vae_tiling=True))
        new.validate()
        return new, "Turned VAE tiling on, because the VAE decode ran out of memory."

    base = replace(spec)
    if failure_kind == "comm":
        if spec.parallel.world_size == 1:
            return None
        rungs, _ = build_ladder(base, gpu_infos, request, p2p=False, allow_fp8=allow_fp8,
                                server_version=server_version)
        for r in rungs:
            if r.spec.parallel.mode in ("none", "cfg") and r.spec.parallel.mode != spec.parallel.mode:
                evaluate_rung(r, request, gpu_infos, sizes, host_available_gib, server_version)
                if r.fits:
                    return r.spec, (f"Switched to {r.label} ({_describe_change(spec, r.spec)}), because the GPUs "
                                    "failed to communicate; it needs little or no traffic between them.")
        return None

    rungs, _ = build_ladder(base, gpu_infos, request, p2p=None, allow_fp8=allow_fp8, server_version=server_version)
    idx = next((i for i, r in enumerate(rungs) if _same_config(r.spec, spec)), -1)
    phase = {"oom_load": "resident", "oom_denoise": "denoise", "oom_decode": "decode",
             "oom_encode": "encode"}.get(failure_kind)
    leaner: list[Rung] = []
    for i, r in enumerate(rungs):
        if i <= idx or _same_config(r.spec, spec) or not _no_regression(spec, r.spec):
            continue
        evaluate_rung(r, request, gpu_infos, sizes, host_available_gib, server_version)
        peak = max(g.torch_peak_gib for g in r.plan.gpus)
        if phase is not None:
            ph_peak = max(g.phases.get(phase, 0.0) for g in r.plan.gpus)
            if ph_peak >= cur_phase_peak.get(phase, float("inf")) - MIN_GAIN_GIB:
                continue
        elif peak >= cur_peak - MIN_GAIN_GIB:
            continue
        leaner.append(r)
    if not leaner:
        return None
    choice = next((r for r in leaner if r.fits), leaner[-1])
    if _same_config(choice.spec, spec):
        return None
    choice.spec.validate()
    what = {"oom_load": "the weights did not fit at startup", "oom_denoise": "denoising ran out of memory",
            "oom_encode": "the VAE encode ran out of memory", "oom_decode": "the VAE decode ran out of memory",
            "oom": "the GPU ran out of memory"}[failure_kind]
    est = max(g.peak_gib for g in choice.plan.gpus)
    return choice.spec, (f"Switched to {choice.label} ({_describe_change(spec, choice.spec)}), because {what}; "
                         f"the estimate for it is {est:.1f} GiB per GPU.")
