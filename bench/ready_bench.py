"""Readiness latency: from /health turning 200 to the supervisor reporting "ready".

Goal: < 0.5 s. The supervisor polls /health every 0.1 s while the child runs, and every
0.02 s once the log says the HTTP server is starting; then it confirms /v1/models lists
the served name. Here an independent poller hits /health every 2 ms from the moment the
port is known, and the difference to the supervisor's `ready` status callback is the
delay a user waits for nothing.

Runs the stub server (tests/contract/stub_vllm_serve.py) in the server environment:

    VLLM_OMNI_LAUNCHER_TEST_SERVER_PYTHON=/tmp/senv/bin/python \\
        /tmp/uenv/bin/python bench/ready_bench.py [--runs 3] [--model Wan-AI/Wan2.2-TI2V-5B-Diffusers]

Prints a table and writes bench/out/ready_bench.json.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "out"
STUB = ROOT / "tests" / "contract" / "stub_vllm_serve.py"

from vllm_omni_launcher.server.process import probe  # noqa: E402
from vllm_omni_launcher.server.config.local_config import LocalConfig  # noqa: E402
from vllm_omni_launcher.server.launch.spec import LaunchSpec  # noqa: E402
from vllm_omni_launcher.server.supervision.supervisor import Status, Supervisor  # noqa: E402


def server_python() -> str:
    return os.environ.get("VLLM_OMNI_LAUNCHER_TEST_SERVER_PYTHON") or sys.executable


def one_run(model: str, data_dir: str, load_delay: float) -> dict[str, Optional[float]]:
    config = LocalConfig(server_command=(server_python(), str(STUB)), data_dir=data_dir,
                         extra_env={"VLLM_OMNI_STUB_LOAD_DELAY_S": str(load_delay)})
    sup = Supervisor(LaunchSpec(model=model, gpus=(0,)), config)
    marks: dict[str, float] = {}
    port_known = threading.Event()
    done = threading.Event()

    def on_status(status: Status) -> None:
        now = time.monotonic()
        if status.port and "port" not in marks:
            marks["port"] = status.port
            port_known.set()
        if status.phase == "ready" and "ready" not in marks:
            marks["ready"] = now

    def poll_health() -> None:
        port_known.wait()
        while not done.is_set():
            if probe.health("127.0.0.1", int(marks["port"]), timeout=0.5) == 200:
                marks["health200"] = time.monotonic()
                return
            time.sleep(0.002)

    poller = threading.Thread(target=poll_health, daemon=True)
    poller.start()
    t0 = time.monotonic()
    try:
        sup.start(on_status=on_status)
        poller.join(timeout=10)
    finally:
        done.set()
        sup.stop(timeout=20)
    h, r = marks.get("health200"), marks.get("ready")
    return {"start_to_ready_s": (r - t0) if r else None,
            "health200_to_ready_s": (r - h) if (r and h) else None}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--model", default="Wan-AI/Wan2.2-TI2V-5B-Diffusers")
    parser.add_argument("--load-delay", type=float, default=1.0, help="stub VLLM_OMNI_STUB_LOAD_DELAY_S")
    args = parser.parse_args()
    if not STUB.exists():
        print(f"missing {STUB}", file=sys.stderr)
        return 2
    rows = []
    with tempfile.TemporaryDirectory(prefix="ready-bench-") as data_dir:
        for i in range(args.runs):
            row = one_run(args.model, data_dir, args.load_delay)
            rows.append(row)
            print(f"run {i + 1}: start->ready {row['start_to_ready_s']:.2f} s, "
                  f"health 200 -> ready {row['health200_to_ready_s']:.3f} s", flush=True)
    delays = [r["health200_to_ready_s"] for r in rows if r["health200_to_ready_s"] is not None]
    summary = {
        "goal_s": 0.5,
        "runs": rows,
        "delay_mean_s": statistics.fmean(delays) if delays else None,
        "delay_max_s": max(delays) if delays else None,
        "meets_goal": bool(delays) and max(delays) < 0.5,
        "python": platform.python_version(), "cpus": os.cpu_count(), "model": args.model,
        "when": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    print()
    print(f"{'metric':<28}{'value':>10}")
    print(f"{'-' * 38}")
    print(f"{'runs':<28}{len(rows):>10}")
    if delays:
        print(f"{'health 200 -> ready, mean':<28}{summary['delay_mean_s']:>9.3f}s")
        print(f"{'health 200 -> ready, max':<28}{summary['delay_max_s']:>9.3f}s")
    print(f"{'goal (< 0.5 s) met':<28}{str(summary['meets_goal']):>10}")
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "ready_bench.json").write_text(json.dumps(summary, indent=2))
    print(f"\nwrote {OUT / 'ready_bench.json'}")
    return 0 if summary["meets_goal"] else 1


if __name__ == "__main__":
    sys.exit(main())
