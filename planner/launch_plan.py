"""Resolve a launch: what the user chose -> a validated LaunchSpec, the plan, the OOM step-down, the limit.

`resolve_launch()` is the one way every launch path turns choices into something to start:
the Local Server node (through `ServingChoice.resolve`, from the Serving Config widgets) and
the CLI's `argv`, `serve` and `generate` (from the launch options). It

- refuses at once, before anything is probed or started, a local launch on a machine where
  NVML says there is no NVIDIA GPU, or GPU ids this machine does not show (`require_gpus`),
  naming the way out: a server on the GPU machine, used through Remote Server / `--url`;
- selects the GPUs (`auto`, `all`, ids, or `count=N` = the first N visible; planner/gpus.py);
- checks the server environment's vllm / vllm-omni pair (`versions.checked_server_version`: the
  one place that decides which vLLM-Omni line will serve); that version is what the extra flags
  are validated against and what the planner's memory and speed figures are calibrated for
  (planner/calibration.py, planner/speed_costs.py: a 0.26 server is planned with 0.26's);
- for `auto`, asks the memory planner for the fastest configuration that fits the GPUs this
  machine shows (NVML, or VLLM_OMNI_LAUNCHER_GPU_MEMORY_GB where NVML cannot see them), then
  validates the spec;
- wires the planner's step-down ladder (same version) as the supervisor's fallback, so an
  out-of-memory failure is retried one rung leaner;
- carries the request limit: when even the leanest configuration does not fit the model's
  default request, the planner names a smaller one that does, and `RequestLimit.apply` uses
  it wherever the request asks for the model's value (0 or unset). A value the user set is
  never changed.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable, Literal, Optional, Sequence

from ..errors import LauncherError, SpecError
from ..server.config.local_config import LocalConfig
from ..server.config.platform_check import require_local_server_platform
from ..server.config.settings import like, setting
from ..server.launch import versions
from ..server.launch.flags import Version
from ..server.launch.spec import (CacheBackend, LaunchSpec, MemoryConfig, OffloadMode, ParallelConfig, ParallelMode,
                                  RuntimeConfig)
from . import replica_plan
from .explicit_fit import check_explicit_fit
from .gpu_memory_env import GPU_MEMORY_ENV, env_gpu_memory, sizes_source
from .gpus import GpuScan, scan_gpus, select_gpus, visible_indices
from .ladder import recommend
from .request_shape import RequestShape
from .speed_costs import idle_cfg_warning
from .step_down import step_down

Fallback = Callable[[LaunchSpec, str], Optional[tuple[LaunchSpec, str]]]
AutoParallelMode = Literal["auto", ParallelMode]       # "auto": the memory planner decides
Speed = Literal["exact", "fast"]                       # what `auto` may trade for speed (speed_costs.fast_levers)


@dataclass(frozen=True)
class RequestLimit:
    """The largest request the serving plan fits when the model's defaults do not (planner reduced it)."""

    width: int
    height: int
    frames: int
    note: str                          # what the planner said, for the Generate node's text

    def apply(self, values: dict[str, Any]) -> tuple[dict[str, Any], str]:
        """`values` (request keywords) with the plan's size where both width and height ask for the
        model's (0 / None) and its frames where frames do; and a note naming what changed ("" if nothing)."""
        changed = dict(values)
        if not values.get("width") and not values.get("height"):
            changed.update(width=self.width, height=self.height)
        if not values.get("frames"):
            changed["frames"] = self.frames
        names = [k for k in ("width", "height", "frames") if changed.get(k) != values.get(k)]
        if not names:
            return values, ""
        return changed, f"{', '.join(names)} from the serving plan ({self.note})"


@dataclass(frozen=True)
class LaunchPlan:
    """What to launch, what to tell the user about it, and how to step down on OOM."""

    spec: LaunchSpec
    text: str                          # the planner's recommendation ("" when not planned); never a warning
    fallback: Optional[Fallback]
    limit: Optional[RequestLimit] = None
    # Every warning, once: the recommended configuration's, the spec's (`spec.validate`), the jobs' (an idle
    # CFG GPU) and explicit settings that do not fit (planner/explicit_fit.py).
    warnings: list[str] = field(default_factory=list)
    server_version: Version = versions.DEFAULT_VERSION   # the vLLM-Omni line the spec was validated against

    def report(self) -> str:
        """The text, then each warning as a `warning:` line: what the Local Server node shows and `argv` prints."""
        return "\n".join(self.text.splitlines() + [f"warning: {w}" for w in self.warnings])


@dataclass(frozen=True)
class ServingChoice:
    """How to serve a model: the Serving Config node's widgets, in widget order (saved workflows
    store them by position, so names, order and values never change), before GPUs are resolved.

    Settings the launch spec also has are declared `like()` its fields; the rest are the
    serving choice's own: the `auto` mode, GPU selection by count, fp8 as a switch, compile
    (the opposite of enforce_eager), keep-alive and the OOM fallback.
    """

    gpus: str = setting("auto", "auto (the planner picks from the visible GPUs), all, GPU ids like 0 or 0,1, "
                                "or count=2 (the first 2 visible)")
    parallel_mode: AutoParallelMode = setting(
        "auto", "one multi-GPU mode: cfg (2 GPUs, CFG on; best without NVLink), ulysses (speed), tensor/hsdp "
        "(memory), ring; none = one GPU; auto = the memory planner decides (and the settings below are its "
        "starting point)")
    parallel_degree: int = like(ParallelConfig, "degree", default=2, min=1, max=8, note="ignored for auto and none")
    vae_patch_parallel: int = like(ParallelConfig, "vae_patch", min=1, max=8, note="1 = off")
    offload: OffloadMode = like(MemoryConfig, "offload")
    fp8: bool = setting(False, "FP8 DiT weights (quantization fp8; not validated upstream for Wan2.2); with "
                               "auto, lets the planner use it, last")
    vae_tiling: bool = like(MemoryConfig, "vae_tiling")
    cache_backend: CacheBackend = like(RuntimeConfig, "cache_backend")
    compile: bool = setting(True, "torch.compile (upstream's default, regional): the server starts slower for "
                                  "faster steps. Measured on one H200, TI2V-5B at 1280x704x121: vLLM-Omni 0.30 was "
                                  "ready about 13 s later (37 s against 22-26 s eager) and 5.6% faster per step "
                                  "(1.66 against 1.76 s), which pays back after about 130 steps; 0.26 was ready in "
                                  "about 127 s compiled against 40 s eager with no measurable gain, and T2V-A14B at "
                                  "832x480x81 ready 24 s later and 0.3 s faster per step. Off = enforce_eager")
    keep_alive_minutes: int = setting(0, "stop the server after this many idle minutes to free the GPUs "
                                         "(0 = keep it running); the next job starts it again", min=0, max=1440)
    auto_fallback: bool = setting(True, "on out-of-memory, step down to a leaner configuration and retry by itself")
    replicas: int = like(LaunchSpec, "replicas", note="with auto, the planner plans one copy on gpus / replicas "
                         "GPUs; the GPUs themselves are what the gpus widget and this machine allow", appended=True)
    speed: Speed = setting("exact", "with auto: exact = only levers that keep the output (offload, tiling, "
                           "parallel modes); fast = also the levers measured faster on this server line whose "
                           "output differs (vLLM-Omni 0.30 on an H200: FP8 DiT weights, 8% per step and 4.3 GiB "
                           "less); the plan text says what it used. Ignored without auto", appended=True)

    def base_spec(self, model: str, config: LocalConfig) -> LaunchSpec:
        """The explicit settings as a spec (for `auto`, the planner's starting point)."""
        auto = self.parallel_mode == "auto"
        parallel = ParallelConfig() if auto else ParallelConfig(
            mode=self.parallel_mode, degree=1 if self.parallel_mode == "none" else self.parallel_degree,
            vae_patch=self.vae_patch_parallel)
        return LaunchSpec(
            model=model, parallel=parallel,
            memory=MemoryConfig(offload=self.offload, quantization="fp8" if self.fp8 else "none",
                                vae_tiling=self.vae_tiling),
            runtime=RuntimeConfig(cache_backend=self.cache_backend, enforce_eager=not self.compile),
            replicas=self.replicas, host=config.host, port=config.port)

    def resolve(self, model: str, config: LocalConfig, queued_jobs: int = 1, cfg: bool = True) -> LaunchPlan:
        """This choice for `model`, resolved (see `resolve_launch`; `queued_jobs`: a batch about to be queued;
        `cfg`: whether the jobs run CFG)."""
        return resolve_launch(self.base_spec(model, config), config, gpus=self.gpus,
                              auto=self.parallel_mode == "auto", allow_fp8=self.fp8,
                              auto_fallback=self.auto_fallback, queued_jobs=queued_jobs, cfg=cfg,
                              speed=self.speed)


def gpu_memory() -> tuple[list[int], list[float], str]:
    """(visible GPU ids, GiB each, where that came from). The env override wins over NVML."""
    visible, sizes, source, _scan = _machine_gpus()
    return visible, sizes, source


def _machine_gpus(given: Optional[Sequence[float]] = None) -> tuple[list[int], list[float], str, Optional[GpuScan]]:
    """gpu_memory (or `given` sizes, for `argv --gpu-memory`), and NVML's answer (None where the sizes
    did not come from NVML)."""
    if given is not None:
        return list(range(len(given))), list(given), "GPU memory given (--gpu-memory)", None
    sizes = env_gpu_memory()
    if sizes is not None:
        return list(range(len(sizes))), sizes, sizes_source(sizes), None
    scan = scan_gpus()
    if not scan.gpus:
        return [], [], f"no GPU information ({scan.reason})", scan
    visible = set(visible_indices(len(scan.gpus)))
    chosen = [g for g in scan.gpus if g.index in visible]
    return [g.index for g in chosen], [g.total_gib for g in chosen], "GPUs from NVML", scan


NO_GPU = "no_gpu"       # the error kind of a local launch on a machine without an NVIDIA GPU
# The way out when this machine cannot run the server: both refusals below name it.
REMOTE_WAY_OUT = ("run the server on the GPU machine (`python -m vllm_omni_launcher serve --model MODEL` there) "
                  "and use it from here: the Remote Server node in ComfyUI, or `generate --url URL` on the "
                  "command line")


def require_gpus(selected: Optional[tuple[int, ...]], visible: list[int], scan: Optional[GpuScan]) -> None:
    """Refuse a local launch that cannot run here: NVML says this machine has no NVIDIA GPU, or the
    selection names GPUs it does not show. Where NVML could not tell (no nvidia-ml-py, no
    permission), nothing is refused: the server finds out itself."""
    if scan is not None and scan.absent:
        raise LauncherError("This machine has no NVIDIA GPU, so it cannot run a local vLLM-Omni server",
                            scan.reason or "NVML found no GPU",
                            f"{REMOTE_WAY_OUT}; if this machine does have GPUs that NVML cannot see, set "
                            f"{GPU_MEMORY_ENV} to their sizes (e.g. 80 or 24,24)", setting="gpus", kind=NO_GPU)
    missing = [g for g in selected or () if visible and g not in visible]
    if missing:
        raise SpecError(f"GPU {', '.join(map(str, missing))} is not on this machine",
                        f"it shows {len(visible)} GPU(s): {', '.join(map(str, visible))}",
                        f"select GPUs from {', '.join(map(str, visible))} (or all / count=N), or {REMOTE_WAY_OUT}",
                        setting="gpus")


def planning_version(config: LocalConfig) -> tuple[Optional[Version], str]:
    """The vLLM-Omni line a plan that starts nothing is made for (`plan`; `generate` picking its model,
    planner/auto_model.py), decided as a launch decides it (`versions.checked_server_version`), and "".
    Where that check refuses the server environment (none set up on this machine, a missing or
    mismatched pair): None, so the planner uses its pinned default and its text says so, and the
    refusal's first sentence. A launch itself refuses such an environment (`resolve_launch`)."""
    try:
        return versions.checked_server_version(config), ""
    except LauncherError as exc:
        return None, exc.what


def resolve_launch(base: LaunchSpec, config: LocalConfig, *, gpus: str = "all", auto: bool = False,
                   allow_fp8: bool = False, auto_fallback: bool = False,
                   server_version: Optional[Version] = None, queued_jobs: int = 1, cfg: bool = True,
                   starts: bool = True, speed: str = "exact",
                   gpu_sizes: Optional[Sequence[float]] = None) -> LaunchPlan:
    """The validated spec for these choices, planned when `auto`.

    base: the explicit settings (with `auto`, only its runtime, network and extra flags are kept).
    gpus: the GPU selection text (`select_gpus`); `base.gpus` is replaced by it.
    server_version: the vLLM-Omni line to validate and plan for; None checks the server environment's
    pair (refusing a missing or mismatched one before anything starts) and uses its line.
    queued_jobs: how many jobs the caller is about to queue (a batch); with `auto`, 2 or more on
    several GPUs makes the planner's text suggest replicas where one GPU fits the model.
    cfg: whether the jobs run CFG (`speed_costs.cfg_runs` of their guidance; True when unknown, as
    the server's default guidance is not 1). Without CFG, `auto` never picks CFG parallel (it
    would idle a GPU) and an explicit CFG-parallel choice gets a warning naming the better one.
    starts: False for `argv`, which only prints the command (for another machine, say): the
    GPUs of this one are then not required.
    speed: "exact" or "fast": with `auto`, whether the planner may also use the levers measured faster
    on this line whose output differs (planner/ladder.py `build_ladder`, speed_costs.fast_levers).
    gpu_sizes: plan for GPUs of these sizes (GiB) instead of this machine's (`argv --gpu-memory`, with
    `starts` False).
    Explicit settings whose load does not fit the known GPU sizes are refused when `starts`, and
    warned about otherwise (planner/explicit_fit.py). The plan's text is the recommendation alone; its
    `warnings` gather every warning, each once.
    """
    visible, sizes, source, scan = _machine_gpus(gpu_sizes)
    hypothetical = scan is None          # sizes from the environment or given: cards of those sizes
    base = replace(base, gpus=select_gpus(gpus, visible))
    if starts:
        require_local_server_platform()      # native Windows first: its way out is WSL2
        require_gpus(base.gpus, visible, scan)
    version = versions.checked_server_version(config) if server_version is None else server_version
    text = ""
    limit: Optional[RequestLimit] = None
    spec = base
    warnings: list[str] = []
    pool = replica_plan.gpu_pool(visible, sizes, hypothetical)
    if auto and sizes:
        chosen = sizes if base.gpus is None else [sizes[visible.index(g)] for g in base.gpus if g in visible]
        planner = replica_plan.recommend_for if base.replicas > 1 else recommend   # per replica, or one
        rec = planner(base, request=replace(RequestShape.default_for(base.family), cfg=cfg),
                      gpus=chosen if hypothetical else None, allow_fp8=allow_fp8,
                      server_version=version, speed=speed)
        if rec.spec is None:
            smaller = "" if base.family.key == "ti2v_5b" else "a smaller model (TI2V-5B), "
            others = f"use {smaller}fewer frames or a smaller size, or more GPUs"
            why, fix = ((rec.reason, f"{rec.way_out}. Otherwise {others}") if rec.fp8_fits else
                        (f"{rec.reason}. {rec.way_out}" if rec.way_out else rec.reason, others))
            raise LauncherError("No serving configuration fits these GPUs", why, fix, setting="serving",
                                raw=rec.text(), raw_label="the memory plan")
        spec, text, warnings = rec.spec, rec.text(), list(rec.warnings)
        ids = list(base.gpus or visible)
        if queued_jobs > 1 and len(ids) > 1:
            advice = replica_plan.replica_advice(spec, len(ids), queued_jobs,
                                                 replica_plan.one_gpu_fits(base, ids[0], pool, server_version=version))
            text += f"\n{advice}" if advice else ""
        if rec.reduced:
            req = rec.request
            limit = RequestLimit(req.width, req.height, req.frames,
                                 f"the serving plan fits {req.label()}, not the model's {rec.asked.label()}")
            text += (f"\nGenerate Video uses {req.label()} where its width, height and frames are 0; "
                     "values you set are sent as they are")
    elif auto and not starts:        # argv: print no one-GPU command the planner never chose
        raise LauncherError("argv --parallel auto has no GPU sizes to plan for",
                            f"{source}, and --gpu-memory is not given",
                            "give the GPU machine's sizes, e.g. --gpu-memory 24,24 (GiB), or run argv on that "
                            "machine, or name the parallel mode (e.g. --parallel ulysses=2)", setting="gpu_memory")
    elif auto:
        text = f"auto: {source}; starting on one GPU without offload (the planner needs GPU memory sizes)"
    warnings += spec.validate(visible_gpus=len(visible) or None, version=version)
    misfit = check_explicit_fit(spec, spec.gpus or visible, visible, sizes, source, cfg=cfg,
                                server_version=version, refuse=starts) if sizes and not auto else None
    warnings += [w for w in (idle_cfg_warning(spec, cfg), misfit) if w]

    fallback: Optional[Fallback] = None
    if auto_fallback and sizes:
        def leaner(failed: LaunchSpec, kind: str) -> Optional[tuple[LaunchSpec, str]]:
            ids = failed.gpus if failed.gpus is not None else tuple(visible)
            why = "oom_load" if kind == "oom_load" else "oom"
            if failed.replicas > 1:    # each replica steps down alike, on its own GPUs
                return replica_plan.per_replica(failed, ids, lambda one, grp: step_down(
                    one, why, [sizes[visible.index(i)] for i in grp if i in visible] or sizes,
                    server_version=version))
            mem = [sizes[visible.index(i)] for i in ids if i in visible] or sizes
            return step_down(failed, why, mem, server_version=version)
        fallback = leaner
    # the recommended configuration's warnings include its spec's: each is said once
    return LaunchPlan(spec, text, fallback, limit, list(dict.fromkeys(warnings)), version)
