"""Throughput against the number of replicas: jobs per minute, 1 replica against 2.

Our Supervisor starts the server with `replicas` 1, then 2 (each time N jobs are submitted at once
through our VideoClient and the clock runs from the first POST to the last job completed, i.e.
GET /v1/videos/{id} says `completed`: the MP4 is encoded and stored). Upstream sends each job to
one replica (round-robin); the server log's `[rep-K] add request: <job id>` lines say which.

Two servers:
- the stub (default; tests/contract/stub_vllm_serve.py: the real vLLM-Omni 0.30 API, orchestrator
  and replica processes, the GPU replaced by a CPU sleep of --step-s per denoise step), on fake
  GPUs 0 and 1. With the step time dominating, 2 replicas should come close to 2x; much less would
  mean that something (our supervision, the API process) serializes the replicas. A sleep is no GPU.
- the real server (`--vllm`: vLLM's CLI main in this python, or `--server-cmd CMD`) on a model
  folder (`--model DIR`). With `--one-gpu` every replica runs on GPU 0 (the one lent H200): our
  spec never does that for users, so the Supervisor launches bench/gpu_replicas_shim.py, which
  folds upstream's `devices` pool onto GPU 0 and execs the server (same pid, same process group).
  Two replicas on one GPU overlap the CPU-side phases (text encoding, VAE decode, MP4 encode,
  HTTP) and share the GPU's compute: expect less than 2x. Reported per setting: ready time, every
  job's finish time and replica, NVML memory (GPU 0 peak, per process), the process group at ready
  and what is left of it after Stop (nothing, by our process-group rule).

    VLLM_OMNI_LAUNCHER_TEST_SERVER_PYTHON=$PWD/.venv-server/bin/python \\
        .venv/bin/python bench/throughput_bench.py [--jobs 8] [--steps 8] [--step-s 0.5] [--replicas 1,2]
    python bench/throughput_bench.py --vllm --model DIR --one-gpu --eager --shape 480x320x33 --steps 10 \\
        --label tiny-ti2v --deadline-s 280 --out R/tiny-ti2v.json        (bench/gpu_session.sh R)

Prints a line per setting and writes the JSON report (default bench/results/throughput-stub-cpu.json)
after every setting; SIGINT (the device phase's time limit) stops the server and writes what was
measured. `python bench/gpu_replicas.py DIR` turns a folder of these reports into a README table.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
STUB = ROOT / "tests" / "contract" / "stub_vllm_serve.py"
SHIM = ROOT / "bench" / "gpu_replicas_shim.py"
OUT = ROOT / "bench" / "results" / "throughput-stub-cpu.json"
MODEL = "Wan-AI/Wan2.2-TI2V-5B-Diffusers"
PROMPT = "a red fox in snow"
STOP_RESERVE_S = 30.0          # stopping a server and writing the report
SERVER_LOG_LINES = 4000

from gpu.common import import_package as _import_package, server_command, server_extra_env  # noqa: E402
import gpu_replicas  # noqa: E402

_import_package()
from vllm_omni_launcher.client.api import VideoClient  # noqa: E402
from vllm_omni_launcher.models import family_for, request_for  # noqa: E402
from vllm_omni_launcher.server.launch import versions  # noqa: E402
from vllm_omni_launcher.server.config.local_config import LocalConfig  # noqa: E402
from vllm_omni_launcher.server.launch.spec import LaunchSpec, RuntimeConfig  # noqa: E402
from vllm_omni_launcher.server.supervision.supervisor import Supervisor  # noqa: E402


def server_python() -> str:
    return os.environ.get("VLLM_OMNI_LAUNCHER_TEST_SERVER_PYTHON") or sys.executable


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


class Clock:
    """Seconds left of --deadline-s (infinite without one)."""

    def __init__(self, deadline_s: Optional[float]) -> None:
        self.t0, self.deadline_s = time.monotonic(), deadline_s

    def left(self) -> float:
        return float("inf") if self.deadline_s is None else self.deadline_s - (time.monotonic() - self.t0)


def run_jobs(client: VideoClient, args: argparse.Namespace, jobs: int, seed0: int, clock: Clock,
             sup: Supervisor) -> dict[str, Any]:
    """Submit `jobs` at once, wait for all; wall time and each job's submit-to-done time."""
    w, h, f = args.shape
    family = family_for(args.model)
    t0 = time.monotonic()
    submitted: dict[str, float] = {}
    for seed in range(seed0, seed0 + jobs):
        req = request_for(family, prompt=PROMPT, width=w, height=h, frames=f, fps=16, steps=args.steps, seed=seed)
        submitted[client.submit(req)] = time.monotonic()
        sup.mark_job_activity()
    done: dict[str, float] = {}
    info: dict[str, Any] = {}
    deadline = min(t0 + 60 + jobs * args.steps * 10, time.monotonic() + max(10.0, clock.left() - STOP_RESERVE_S))
    while len(done) < jobs:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{jobs - len(done)} of {jobs} job(s) did not finish in time")
        for job_id in [j for j in submitted if j not in done]:
            state = client.status(job_id)
            if state.status == "failed":
                raise RuntimeError(f"job {job_id} failed: {state.error}")
            if state.status == "completed":
                done[job_id] = time.monotonic()
                info[job_id] = state.raw.get("inference_time_s")
        sup.mark_job_activity()
        time.sleep(args.poll_s)
    wall = max(done.values()) - t0
    rows = [{"job": j, "submitted_s": round(submitted[j] - t0, 3), "done_s": round(done[j] - t0, 3),
             "job_s": round(done[j] - submitted[j], 2), "inference_time_s": info[j]} for j in submitted]
    return {"jobs": jobs, "wall_s": round(wall, 2), "jobs_per_min": round(jobs * 60 / wall, 2),
            "job_s": sorted(r["job_s"] for r in rows), "per_job": rows}


def _gpu() -> Any:
    """The NVML sampler of the ComfyUI GPU driver (disabled where nvidia-smi is missing)."""
    from gpu.common import Gpu

    return Gpu(True)


def one_setting(row: dict[str, Any], args: argparse.Namespace, server_cmd: list[str], extra_env: dict[str, str],
                data_dir: str, clock: Clock, gpu: Any) -> None:
    """Start, measure and stop one replica count, filling `row` as it goes (so a SIGINT keeps
    what was measured; the finally always stops the server and checks its processes are gone)."""
    replicas = row["replicas"]
    config = LocalConfig(server_command=tuple(server_cmd), data_dir=data_dir, extra_env=extra_env,
                         startup_timeout_s=1200)
    if args.one_gpu:   # the shim puts every replica on GPU 0; the spec itself names no GPU list then
        gpus: Optional[tuple[int, ...]] = (0,) if replicas == 1 else None
    else:
        gpus = tuple(range(replicas))
    spec = LaunchSpec(model=args.model, gpus=gpus, replicas=replicas,
                      runtime=RuntimeConfig(enforce_eager=True) if args.eager else RuntimeConfig())
    sup = Supervisor(spec, config)
    row["flags"] = spec.flags()
    t0 = time.monotonic()
    members: list[dict[str, Any]] = []
    pgid, gpu_procs, log_text = None, None, ""
    try:
        sup.start(timeout=max(60.0, min(1200.0, clock.left() - STOP_RESERVE_S)))
        row["start_to_ready_s"] = round(time.monotonic() - t0, 1)
        row["status"] = sup.status().text
        pgid = sup.pgid
        members = gpu_replicas.group_members(pgid)
        row["nvml_after_ready_mib"] = gpu.peak_mib(time.monotonic() - 1.0)
        client = VideoClient(sup.url or "", api_key=sup.api_key, server_version=sup.server_version)
        with client:
            run_jobs(client, args, replicas, 1000, clock, sup)        # warm: every replica has run one job
            gpu_procs = gpu.processes()
            t_jobs = time.monotonic()
            row.update(run_jobs(client, args, args.jobs, 1, clock, sup))
            row["nvml_peak_mib"] = gpu.peak_mib(t_jobs)
    except Exception as exc:    # the report keeps what failed and the log's last lines; later settings still run
        row["error"] = f"{type(exc).__name__}: {exc}"[:2000]
        row["log_tail"] = sup.tail(40)
        gpu_procs = gpu.processes()
    finally:
        log_text = _read(sup.log_path)
        if args.server_logs:     # the whole server log (its last lines when long), for the device report
            Path(args.server_logs).mkdir(parents=True, exist_ok=True)
            tail = "\n".join(log_text.splitlines()[-SERVER_LOG_LINES:])
            (Path(args.server_logs) / f"{args.label or 'run'}-r{replicas}.server.log").write_text(tail + "\n")
        t_stop = time.monotonic()
        sup.stop()
        row["stop_s"] = round(time.monotonic() - t_stop, 2)
        time.sleep(1.0)
        pids = [m["pid"] for m in members]
        row["processes"] = {"replica_pids": sup.replica_pids, "group_at_ready": members,
                            "left_after_stop": gpu_replicas.still_alive(pids) + [
                                m["pid"] for m in gpu_replicas.group_members(pgid) if m["pid"] not in pids]}
        row["gpu_processes_after_stop"] = gpu.processes()
        row["gpu_mib_by_pid"] = gpu_replicas.gpu_mib_by_pid(gpu_procs)
        if "per_job" in row:
            replica_of = gpu_replicas.replica_of_jobs(log_text, [r["job"] for r in row["per_job"]], replicas)
            for job in row["per_job"]:
                job["replica"] = replica_of[job["job"]]
            row["jobs_per_replica"] = gpu_replicas.jobs_per_replica(replica_of)
        row["log_evidence"] = gpu_replicas.log_evidence(log_text)


def _read(path: Optional[str]) -> str:
    try:
        return Path(path).read_text(errors="replace") if path else ""
    except OSError:
        return ""


def servers(args: argparse.Namespace) -> tuple[list[str], dict[str, str], str]:
    """The server program, its extra environment and a description for the report."""
    if args.server_cmd or args.vllm:
        cmd, env = server_command(args.server_cmd), server_extra_env()
        what = "real vLLM-Omni server" if args.vllm else f"server command {args.server_cmd}"
    else:
        cmd, env = [server_python(), str(STUB)], {}
        what = ("tests/contract/stub_vllm_serve.py: real vLLM-Omni 0.30 API + orchestrator + replica processes, "
                "fake GPU (a CPU sleep of step_s per denoise step)")
    if not args.vllm:
        env["VLLM_OMNI_STUB_STEP_S"] = str(args.step_s)
    if args.one_gpu:
        os.environ["CUDA_VISIBLE_DEVICES"] = "0"     # the server sees GPU 0 only; the shim maps every replica there
        cmd = [versions.server_python(cmd) or sys.executable, str(SHIM), *cmd]
    return cmd, env, what


def gpu_name() -> Optional[str]:
    if not shutil.which("nvidia-smi"):
        return None
    out = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True, timeout=20)
    return out.stdout.strip() or None


def fits(rows: list[dict[str, Any]], replicas: int, clock: Clock) -> Optional[str]:
    """Why the next setting cannot finish before the deadline (None: it can). The estimate adds half
    the last setting's ready time per extra replica (each replica process imports vLLM and loads
    the model; the API process and the first import are shared) to its jobs' time and a stop."""
    last = next((r for r in reversed(rows) if "wall_s" in r), None)
    if last is None or clock.deadline_s is None:
        return None
    ready = last["start_to_ready_s"] * (1 + 0.5 * (replicas - last["replicas"]) / last["replicas"])
    need = ready + last["wall_s"] * 1.5 + STOP_RESERVE_S
    return None if need <= clock.left() else f"skipped: needs ~{need:.0f} s, {clock.left():.0f} s left"


def parse_shape(text: str) -> tuple[int, int, int]:
    w, h, f = (int(x) for x in text.lower().split("x"))
    return w, h, f


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=8, help="jobs submitted at once (default 8)")
    parser.add_argument("--steps", type=int, default=8, help="denoise steps per job (default 8)")
    parser.add_argument("--step-s", type=float, default=0.5, help="stub seconds per step (default 0.5)")
    parser.add_argument("--replicas", default="1,2", help="replica counts to run (default 1,2)")
    parser.add_argument("--model", default=MODEL, help=f"model id or Diffusers folder (default {MODEL}, the stub's)")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--vllm", action="store_true", help="the real server: vLLM's CLI main in this python")
    where.add_argument("--server-cmd", default=None, help="the server program our Supervisor launches")
    parser.add_argument("--one-gpu", action="store_true",
                        help="every replica on GPU 0 (through bench/gpu_replicas_shim.py); else replica r on GPU r")
    parser.add_argument("--eager", action="store_true", help="--enforce-eager (no torch.compile warm-up)")
    parser.add_argument("--shape", type=parse_shape, default=(256, 128, 9), help="WxHxF (default 256x128x9)")
    parser.add_argument("--poll-s", type=float, default=0.05, help="seconds between status rounds (default 0.05)")
    parser.add_argument("--deadline-s", type=float, default=None, help="seconds for everything; a setting that "
                        "would not fit is skipped")
    parser.add_argument("--server-logs", default=None, help="folder for each setting's server log (LABEL-rN.server.log)")
    parser.add_argument("--label", default=None, help="the run's name in the README table")
    parser.add_argument("--out", default=str(OUT), help=f"JSON result (default {OUT.relative_to(ROOT)})")
    args = parser.parse_args()
    clock = Clock(args.deadline_s)
    server_cmd, extra_env, what = servers(args)
    found = versions.detect(server_cmd, extra_env=extra_env)
    w, h, f = args.shape
    report: dict[str, Any] = {
        "bench": "throughput_bench", "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "label": args.label or ("stub" if what.startswith("tests/") else Path(args.model).name),
        "command": ("python " if args.vllm or args.server_cmd else
                    "VLLM_OMNI_LAUNCHER_TEST_SERVER_PYTHON=$PWD/.venv-server/bin/python .venv/bin/python ")
                   + " ".join(shlex.quote(a) for a in ["bench/throughput_bench.py", *sys.argv[1:]]),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version(),
                    "gpu": gpu_name()},
        "server": what, "model": args.model,
        "server_versions": None if found is None else {"python": found.python, "vllm": found.vllm,
                                                       "vllm_omni": found.vllm_omni},
        "layout": "every replica on GPU 0 (CUDA_VISIBLE_DEVICES=0, devices pool folded by the shim)"
                  if args.one_gpu else "replica r on GPU r",
        "request": f"{w}x{h}, {f} frames, one seed per job", "eager": args.eager, "poll_s": args.poll_s,
        "jobs": args.jobs, "steps": args.steps, "results": [],
    }
    if not args.vllm:
        report.update(step_s=args.step_s, denoise_s_per_job=args.steps * args.step_s,
                      serial_denoise_s=args.jobs * args.steps * args.step_s)
    rows: list[dict[str, Any]] = report["results"]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    gpu = _gpu()

    def save() -> None:
        measured = [r for r in rows if "jobs_per_min" in r]
        for row in measured:
            row["speedup_vs_first"] = round(row["jobs_per_min"] / measured[0]["jobs_per_min"], 2)
        out.write_text(json.dumps(report, indent=2, default=str) + "\n")

    try:
        with tempfile.TemporaryDirectory(prefix="throughput-") as tmp:
            for n in (int(x) for x in args.replicas.split(",")):
                why = fits(rows, n, clock)
                if why:
                    rows.append({"replicas": n, "skipped": why})
                    say(f"replicas {n}: {why}")
                    continue
                say(f"replicas {n}: starting ({clock.left():.0f} s left)")
                rows.append({"replicas": n})
                one_setting(rows[-1], args, server_cmd, extra_env, os.path.join(tmp, f"r{n}"), clock, gpu)
                save()
                last = rows[-1]
                if "error" in last:
                    say(f"replicas {n}: FAILED {last['error']}")
                else:
                    say(f"replicas {n}: {last['jobs']} jobs in {last['wall_s']:.1f} s = {last['jobs_per_min']:.1f} "
                        f"jobs/min (ready after {last['start_to_ready_s']:.0f} s; per replica "
                        f"{last.get('jobs_per_replica')}; left after stop {last['processes']['left_after_stop']})")
    except KeyboardInterrupt:
        report["interrupted"] = f"SIGINT during setting {len(rows)} (the phase's time limit); the server was stopped"
        if rows and "jobs_per_min" not in rows[-1] and "error" not in rows[-1]:
            rows[-1]["error"] = "interrupted (SIGINT) before its jobs finished"
        say(report["interrupted"])
    finally:
        gpu.close()
        save()
    print(f"wrote {args.out}")
    return 0 if rows and all("jobs_per_min" in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
