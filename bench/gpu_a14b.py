"""Full-size T2V-A14B on one GPU through OUR Supervisor and client: eager against compiled.

The one-GPU half of issue 16 and issue 14's compile-or-eager question for A14B. One server per
call (`--mode eager` adds `--enforce-eager`; `--mode compile` is upstream's default,
torch.compile), then jobs in this order: the first shape at the first guidance twice (the
difference is the first job's extra time, e.g. compiling), then every other (shape, guidance).
Guidance `default` is the model's recommended 4.0 / 3.0 (CFG on: two DiT passes per step);
`1` turns CFG off (the distill-LoRA workflows). Per job: client wall time, the server's
`inference_time_s`, our overhead (wall minus it: submit, noticing completion, download,
decode), seconds per step and denoise time (from the server log), the NVML peak of GPU 0
(sampled every 0.2 s) against the planner's predicted peak for that GPU.

A job is started only when its expected time (a prior from the earlier H200 runs, rescaled by
the jobs measured so far) fits the time left (`--deadline-s`), and the report is rewritten after
every job, so a device call cut short still returns what it measured.

usage: python bench/gpu_a14b.py --model DIR --mode eager|compile --out FILE
       [--shapes 832x480x81,1280x720x81] [--guidance default,1] [--steps 4] [--deadline-s 520]
       [--server-cmd CMD]   (the stub server for the CPU rehearsal: bench/gpu_session.sh cpu-a14b)
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

from gpu.common import import_package as _import_package, server_command, server_extra_env  # noqa: E402

PROMPT = "a red fox running through snow"
STOP_RESERVE_S = 35.0          # stopping the server and writing the report after the last job
JOB_MARGIN = 1.25              # a job starts only when expected x this fits the time left
# Priors (one H200, vllm-omni 0.26, eager, random weights): 1280x720x81 with CFG ran 31.48 s per
# step and 132.1 s per 4-step job, so about 6 s of it was not denoising (text encoding, VAE
# decode, MP4). Other sizes scale with tokens^1.5 (attention dominates at these lengths),
# CFG off halves the step; a compiled server's first job of a shape may compile for a while.
PRIOR_TOKENS = 21 * 45 * 80
PRIOR_STEP_S = 31.5
PRIOR_FIXED_S = 6.0
PRIOR_COMPILE_FIRST_S = 90.0
LOG_EVIDENCE = re.compile(r"loading took|Loading weights took|GiB|compil|warm|Available routes|graph", re.I)


@dataclass(frozen=True)
class Job:
    """One planned request: its shape, guidance label and whether it repeats the first job."""

    width: int
    height: int
    frames: int
    guidance: str            # "default" (the model's recommended values) or a number
    repeat_of_first: bool = False

    @property
    def shape(self) -> str:
        return f"{self.width}x{self.height}x{self.frames}"

    @property
    def cfg(self) -> bool:
        """Upstream runs CFG (two passes per step) when guidance > 1."""
        return self.guidance == "default" or float(self.guidance) > 1.0

    def tokens(self) -> int:
        """DiT tokens (Wan2.1 VAE: x4 time, x8 space; 1x2x2 patches)."""
        return ((self.frames - 1) // 4 + 1) * (self.height // 16) * (self.width // 16)


def parse_shapes(text: str) -> list[tuple[int, int, int]]:
    return [tuple(int(v) for v in item.lower().split("x")) for item in text.split(",") if item]  # type: ignore[misc]


def job_plan(shapes: list[tuple[int, int, int]], guidances: list[str]) -> list[Job]:
    """First (shape, guidance) twice, then the rest: shapes outer, guidances inner."""
    jobs = [Job(w, h, f, g) for (w, h, f) in shapes for g in guidances]
    if jobs:
        first = jobs[0]
        jobs.insert(1, Job(first.width, first.height, first.frames, first.guidance, repeat_of_first=True))
    return jobs


def prior_s(job: Job, steps: int, mode: str, first_of_shape: bool) -> float:
    """Expected wall time of `job` before anything was measured (see the PRIOR_* constants)."""
    ratio = job.tokens() / PRIOR_TOKENS
    step = PRIOR_STEP_S * ratio ** 1.5 * (1.0 if job.cfg else 0.5)
    extra = PRIOR_COMPILE_FIRST_S if mode == "compile" and first_of_shape else 0.0
    return steps * step + PRIOR_FIXED_S * max(ratio, 0.2) + extra


def expected_s(job: Job, steps: int, mode: str, first_of_shape: bool, done: list[dict[str, Any]]) -> float:
    """The prior rescaled by how the measured jobs compared with their own priors (the median);
    a compiled server's first job of a shape does not count (its compile time is a guess)."""
    ratios = sorted(r["wall_s"] / r["prior_s"] for r in done if r.get("wall_s") and r.get("prior_s")
                    and not (mode == "compile" and r.get("first_of_shape")))
    scale = ratios[len(ratios) // 2] if ratios else 1.0
    return prior_s(job, steps, mode, first_of_shape) * scale


def fits(expected: float, left: float, first: bool) -> bool:
    """Whether a job may start. The server's first job always may while a minute is left (its
    timeout still ends it in time, and even a cut job leaves its seconds per step in the log);
    later ones only when the expected time fits."""
    if first:
        return left >= STOP_RESERVE_S + 60.0
    return expected * JOB_MARGIN + STOP_RESERVE_S <= left


def job_row(job: Job, timings: dict[str, float], progress: Any, steps: int) -> dict[str, Any]:
    """The measured numbers of one finished job, from the client's timings and the log's progress."""
    wall = timings["decoded"]
    inference = timings.get("server_inference")
    sps = getattr(progress, "seconds_per_step", None)
    denoise = None
    if progress is not None and getattr(progress, "done", False):
        denoise = round(progress.updated_at - progress.started_at, 3)
    return {
        "shape": job.shape, "guidance": job.guidance, "cfg": job.cfg, "steps": steps,
        "repeat_of_first": job.repeat_of_first,
        "wall_s": round(wall, 3),
        "inference_time_s": None if inference is None else round(inference, 3),
        "overhead_s": None if inference is None else round(wall - inference, 3),
        "submit_s": round(timings.get("submit", 0.0), 4),
        "detect_s": None if inference is None else round(timings["job_done"] - timings.get("submit", 0.0) - inference, 4),
        "download_s": round(timings["downloaded"] - timings["job_done"], 4),
        "decode_s": round(timings["decoded"] - timings["downloaded"], 4),
        "seconds_per_step": None if sps is None else round(sps, 3),
        "denoise_s_from_log": denoise,
        "not_denoise_s": None if inference is None or sps is None else round(inference - steps * sps, 3),
    }


def summarize(jobs: list[dict[str, Any]]) -> dict[str, Any]:
    """First-job extra time and per-(shape, guidance) medians of the measured jobs."""
    done = [j for j in jobs if "wall_s" in j]
    out: dict[str, Any] = {"first_job_extra_s": None}
    repeat = next((j for j in done if j.get("repeat_of_first")), None)
    first = None if repeat is None else next(
        (j for j in done if j["shape"] == repeat["shape"] and j["guidance"] == repeat["guidance"]
         and not j.get("repeat_of_first")), None)
    if first is not None:
        out["first_job_extra_s"] = round(first["wall_s"] - repeat["wall_s"], 2)
    rows: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for j in done:
        rows.setdefault((j["shape"], j["guidance"]), []).append(j)
    out["by_request"] = []
    for (shape, guidance), items in rows.items():
        steady = [j for j in items if j.get("repeat_of_first")] or items   # the repeat is the warm number
        best = steady[-1]
        out["by_request"].append({k: best.get(k) for k in (
            "shape", "guidance", "cfg", "wall_s", "inference_time_s", "overhead_s", "seconds_per_step",
            "nvml_peak_gib", "planner_peak_gib", "planner_error_pct")})
    return out


def planner_prediction(spec: Any, job: Job) -> dict[str, Any]:
    from vllm_omni_launcher.planner.memory import RequestShape, plan

    predicted = plan(spec, RequestShape(job.width, job.height, job.frames, cfg=job.cfg), host_available_gib=None)
    return {"planner_peak_gib": round(predicted.peak_gib, 2),
            "planner_gpu": [g.to_dict() for g in predicted.gpus]}


def run(args: argparse.Namespace, save: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    from gpu.common import Gpu, ServerRun
    from vllm_omni_launcher.models import family_for, request_for
    from vllm_omni_launcher.server.launch import versions
    from vllm_omni_launcher.server.config.local_config import LocalConfig
    from vllm_omni_launcher.server.launch.spec import LaunchSpec, RuntimeConfig

    t_begin = time.monotonic()
    left = lambda: args.deadline_s - (time.monotonic() - t_begin)  # noqa: E731
    server_cmd, extra_env = server_command(args.server_cmd), server_extra_env()
    found = versions.detect(server_cmd, extra_env=extra_env)
    spec = LaunchSpec(args.model, gpus=(0,), runtime=RuntimeConfig(enforce_eager=args.mode == "eager"))
    spec.validate()
    family = family_for(args.model)
    build_info = Path(args.model) / "fullsize_build.json"
    report: dict[str, Any] = {
        "bench": "gpu_a14b", "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": " ".join(sys.argv), "mode": args.mode, "model": args.model, "family": family.key,
        "model_build": json.loads(build_info.read_text()) if build_info.is_file() else None,
        "server_versions": None if found is None else {"python": found.python, "vllm": found.vllm,
                                                       "vllm_omni": found.vllm_omni},
        "flags": spec.flags(), "steps": args.steps, "jobs": [], "ok": False,
    }
    gpu = Gpu(True)
    config = LocalConfig(server_command=tuple(server_cmd), data_dir=args.data_dir, extra_env=extra_env,
                         startup_timeout_s=max(60.0, min(600.0, left() - STOP_RESERVE_S)))
    phases: list[tuple[str, float]] = []
    t0 = time.monotonic()
    with ServerRun(report, spec, config, tail_lines=60, settle_s=2.0) as run:
        sup, client = run.start(on_status=lambda st: phases.append((st.phase, round(time.monotonic() - t0, 2)))
                                if not phases or phases[-1][0] != st.phase else None)
        report["phases"] = phases
        report["nvml_after_ready_gib"] = _gib(gpu.peak_mib(time.monotonic() - 1.0))
        report["log_evidence"] = [line for line in sup.tail(400) if LOG_EVIDENCE.search(line)][-30:]
        save(report)
        seen_shapes: set[str] = set()
        for seed, job in enumerate(job_plan(parse_shapes(args.shapes), args.guidance.split(",")), start=1):
            first_of_shape = job.shape not in seen_shapes
            expected = expected_s(job, args.steps, args.mode, first_of_shape, report["jobs"])
            if not fits(expected, left(), first=not seen_shapes):
                report["jobs"].append({"shape": job.shape, "guidance": job.guidance,
                                       "repeat_of_first": job.repeat_of_first,
                                       "skipped": f"expected {expected:.0f} s, {left():.0f} s left"})
                continue
            seen_shapes.add(job.shape)
            value = None if job.guidance == "default" else float(job.guidance)
            req = request_for(family, prompt=PROMPT, width=job.width, height=job.height, frames=job.frames,
                              steps=args.steps, guidance=value, guidance_2=value, seed=seed)
            due = sup.job_hint()[1]
            prediction = planner_prediction(spec, job)
            t_job = time.monotonic()
            try:
                result = client.generate(req, due=due, timeout_s=max(30.0, left() - STOP_RESERVE_S))
            except Exception as exc:   # the report keeps the server's own words; later jobs still try
                progress = sup.progress()
                report["jobs"].append({"shape": job.shape, "guidance": job.guidance,
                                       "repeat_of_first": job.repeat_of_first,
                                       "error": f"{type(exc).__name__}: {exc}"[:2000],
                                       "after_s": round(time.monotonic() - t_job, 2),
                                       "progress_at_error": None if progress is None else {
                                           "step": progress.step, "total": progress.total,
                                           "seconds_per_step": progress.seconds_per_step}})
                save(report)
                if not sup.alive():
                    break
                continue
            row = job_row(job, result.timings, sup.progress(), args.steps)
            peak = gpu.peak_mib(t_job)
            row.update(prior_s=round(prior_s(job, args.steps, args.mode, first_of_shape), 1),
                       expected_s=round(expected, 1), first_of_shape=first_of_shape,
                       guidance_sent=[req.guidance, req.guidance_2], frames_shape=list(result.video.frames.shape),
                       fps=result.video.fps, nvml_peak_gib=_gib(peak), **prediction)
            if isinstance(row["nvml_peak_gib"], float):
                row["planner_error_pct"] = round(100 * (row["planner_peak_gib"] / row["nvml_peak_gib"] - 1), 1)
            report["jobs"].append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "planner_gpu"}), flush=True)
            save(report)
    gpu.close()
    measured = [j for j in report["jobs"] if "wall_s" in j]
    report["summary"] = summarize(report["jobs"])
    report["ok"] = "error" not in report and bool(measured) and not any("error" in j for j in report["jobs"])
    return report


def _gib(mib: Any) -> Any:
    return round(mib / 1024, 2) if isinstance(mib, int) else mib


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="the full-size T2V-A14B folder (make_fullsize_a14b.py)")
    parser.add_argument("--mode", choices=("eager", "compile"), required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--shapes", default="832x480x81,1280x720x81", help="WxHxF list, in order")
    parser.add_argument("--guidance", default="default,1", help="'default' (4.0/3.0) and/or numbers, in order")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--deadline-s", type=float, default=520.0, help="seconds for start, jobs and stop")
    parser.add_argument("--server-cmd", default=None, help="server program (default: vllm's CLI in this python)")
    parser.add_argument("--data-dir", default="/tmp/vllm-omni-launcher-a14b")
    args = parser.parse_args()
    _import_package()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    save = lambda report: out.write_text(json.dumps(report, indent=1, default=str))  # noqa: E731
    report = run(args, save)
    save(report)
    print(f"ok={report['ok']} ready_s={report.get('ready_s')} jobs={len(report['jobs'])} -> {out}")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
