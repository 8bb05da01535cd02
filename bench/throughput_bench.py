"""Throughput against the number of replicas: jobs per minute with a fixed (fake) GPU step time.

The stub server (tests/contract/stub_vllm_serve.py: the real vLLM-Omni 0.30 API, orchestrator
and replica processes, with the GPU replaced by a CPU sleep per denoise step) is started by our
Supervisor with `replicas` 1, then 2, on fake GPUs 0 and 1. Each time N jobs are submitted at
once and the clock runs from the first POST to the last job completed (GET /v1/videos/{id}).
Upstream sends each job to one replica (round-robin), so with the step time dominating, 2
replicas should come close to 2x; much less would mean that something (our supervision, the
API process) serializes the replicas. The sleep is not a GPU: this shows the routing and the
supervision, not a real speedup (a GPU run is issue 17's other half).

    VLLM_OMNI_LAUNCHER_TEST_SERVER_PYTHON=$PWD/.venv-server/bin/python \\
        .venv/bin/python bench/throughput_bench.py [--jobs 8] [--steps 8] [--step-s 0.5] [--replicas 1,2]

Prints a table and writes bench/results/throughput-stub-cpu.json (with the command line).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import requests

ROOT = Path(__file__).resolve().parents[1]
STUB = ROOT / "tests" / "contract" / "stub_vllm_serve.py"
OUT = ROOT / "bench" / "results" / "throughput-stub-cpu.json"
MODEL = "Wan-AI/Wan2.2-TI2V-5B-Diffusers"

from vllm_omni_launcher.server.local_config import LocalConfig  # noqa: E402
from vllm_omni_launcher.server.spec import LaunchSpec  # noqa: E402
from vllm_omni_launcher.server.supervisor import Supervisor  # noqa: E402


def server_python() -> str:
    return os.environ.get("VLLM_OMNI_LAUNCHER_TEST_SERVER_PYTHON") or sys.executable


def _headers(sup: Supervisor) -> dict[str, str]:
    return {"Authorization": f"Bearer {sup.api_key}"} if sup.api_key else {}


def run_jobs(sup: Supervisor, jobs: int, steps: int) -> dict[str, Any]:
    """Submit `jobs` at once, wait for all; wall time and each job's submit-to-done time."""
    fields = {"prompt": "a red fox in snow", "width": "256", "height": "128", "num_frames": "9", "fps": "16",
              "num_inference_steps": str(steps)}
    http = requests.Session()
    t0 = time.monotonic()
    ids = {}
    for seed in range(jobs):
        r = http.post(f"{sup.url}/v1/videos", files={k: (None, v) for k, v in {**fields, "seed": str(seed)}.items()},
                      headers=_headers(sup), timeout=60)
        r.raise_for_status()
        ids[r.json()["id"]] = time.monotonic()
    done: dict[str, float] = {}
    deadline = t0 + 60 + jobs * steps * 10
    while len(done) < jobs:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{jobs - len(done)} job(s) did not finish")
        for job_id in [j for j in ids if j not in done]:
            state = http.get(f"{sup.url}/v1/videos/{job_id}", headers=_headers(sup), timeout=30).json()
            if state.get("status") == "failed":
                raise RuntimeError(f"job {job_id} failed: {state}")
            if state.get("status") == "completed":
                done[job_id] = time.monotonic()
        time.sleep(0.05)
    wall = max(done.values()) - t0
    return {"jobs": jobs, "wall_s": round(wall, 2), "jobs_per_min": round(jobs * 60 / wall, 2),
            "job_s": sorted(round(done[j] - ids[j], 2) for j in ids)}


def one_setting(replicas: int, args: argparse.Namespace, data_dir: str) -> dict[str, Any]:
    config = LocalConfig(server_command=(server_python(), str(STUB)), data_dir=data_dir, startup_timeout_s=1200,
                         extra_env={"VLLM_OMNI_STUB_STEP_S": str(args.step_s)})
    sup = Supervisor(LaunchSpec(model=MODEL, gpus=tuple(range(replicas)), replicas=replicas), config)
    t0 = time.monotonic()
    sup.start(timeout=1200)
    try:
        ready_s = time.monotonic() - t0
        run_jobs(sup, replicas, args.steps)              # warm: every replica has run one job
        result = run_jobs(sup, args.jobs, args.steps)
    finally:
        sup.stop()
    return {"replicas": replicas, "start_to_ready_s": round(ready_s, 1), **result}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=8, help="jobs submitted at once (default 8)")
    parser.add_argument("--steps", type=int, default=8, help="denoise steps per job (default 8)")
    parser.add_argument("--step-s", type=float, default=0.5, help="stub seconds per step (default 0.5)")
    parser.add_argument("--replicas", default="1,2", help="replica counts to run (default 1,2)")
    parser.add_argument("--out", default=str(OUT), help=f"JSON result (default {OUT.relative_to(ROOT)})")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="throughput-") as tmp:
        for n in (int(x) for x in args.replicas.split(",")):
            rows.append(one_setting(n, args, os.path.join(tmp, f"r{n}")))
            print(f"replicas {n}: {rows[-1]['jobs']} jobs in {rows[-1]['wall_s']:.1f} s = "
                  f"{rows[-1]['jobs_per_min']:.1f} jobs/min (ready after {rows[-1]['start_to_ready_s']:.0f} s)",
                  flush=True)
    base = rows[0]["jobs_per_min"]
    for row in rows:
        row["speedup_vs_first"] = round(row["jobs_per_min"] / base, 2)
    ideal_s = args.jobs * args.steps * args.step_s
    report = {
        "bench": "throughput_bench", "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": "VLLM_OMNI_LAUNCHER_TEST_SERVER_PYTHON=$PWD/.venv-server/bin/python .venv/bin/python "
                   + " ".join(shlex.quote(a) for a in ["bench/throughput_bench.py", *sys.argv[1:]]),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version()},
        "server": "tests/contract/stub_vllm_serve.py: real vLLM-Omni 0.30 API + orchestrator + replica processes, "
                  "fake GPU (a CPU sleep of step_s per denoise step)",
        "request": "256x128, 9 frames, TI2V-5B, one seed per job",
        "jobs": args.jobs, "steps": args.steps, "step_s": args.step_s,
        "denoise_s_per_job": args.steps * args.step_s, "serial_denoise_s": ideal_s,
        "results": rows,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
