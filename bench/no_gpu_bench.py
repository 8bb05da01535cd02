"""How long a machine without an NVIDIA GPU waits for "this machine cannot run a local server".

Run on such a machine (a CPU box, CI), with the real NVML of this machine (no stand-in):

    .venv/bin/python bench/no_gpu_bench.py [--repeat 5]

Two callers of the one check (planner/launch_plan.resolve_launch):
- Local Server: the node's call, `VLLMOmniLocalServer().start(...)`, in a process that has
  imported the package already (as ComfyUI has when a prompt is queued): the seconds from the
  call to the error;
- `generate --prompt ...`: the whole command, `python -m vllm_omni_launcher generate`, from
  spawn to exit (interpreter start and imports included), as a user waits for it.

Before the check existed both started a server that failed 207-220 s later. Prints a table
(median, max) and writes bench/out/no_gpu_bench.json; it refuses to run where NVML finds a GPU.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "contract"))
from comfy_standin import ComfyStandIn, run_node  # noqa: E402

from vllm_omni_launcher.errors import LauncherError  # noqa: E402
from vllm_omni_launcher.planner.gpus import scan_gpus  # noqa: E402
from vllm_omni_launcher.planner.launch_plan import GPU_MEMORY_ENV, NO_GPU, ServingChoice  # noqa: E402

MODEL = "Wan-AI/Wan2.2-TI2V-5B-Diffusers"


def local_server_call() -> float:
    """Seconds from the Local Server node's call to its error."""
    with ComfyStandIn():
        model = run_node("VLLMOmniLoadModel", MODEL)[0]
        start = time.perf_counter()
        try:
            run_node("VLLMOmniLocalServer", model, ServingChoice(), unique_id="bench")
        except LauncherError as exc:
            took = time.perf_counter() - start
            if exc.kind != NO_GPU:
                raise
            return took
    raise SystemExit("the Local Server node did not refuse this machine")


def generate_command(env: dict[str, str], cwd: str) -> float:
    """Seconds from spawning `generate --prompt` to its exit with the no-GPU error."""
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "vllm_omni_launcher", "generate", "--prompt", "a fox"],
                         capture_output=True, text=True, env=env, cwd=cwd, timeout=120)
    took = time.perf_counter() - start
    if out.returncode != 1 or "has no NVIDIA GPU" not in out.stderr:
        raise SystemExit(f"generate did not refuse this machine: rc={out.returncode}\n{out.stderr}")
    return took


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    if os.environ.get(GPU_MEMORY_ENV) or not scan_gpus().absent:
        raise SystemExit(f"this machine has (or {GPU_MEMORY_ENV} claims) a GPU: run this on one without")
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, VLLM_OMNI_LAUNCHER_CONFIG=str(Path(tmp) / "none.json"),
                   VLLM_OMNI_LAUNCHER_DATA_DIR=str(Path(tmp) / "data"))
        os.environ.update(VLLM_OMNI_LAUNCHER_CONFIG=env["VLLM_OMNI_LAUNCHER_CONFIG"],
                          VLLM_OMNI_LAUNCHER_DATA_DIR=env["VLLM_OMNI_LAUNCHER_DATA_DIR"])
        rows = {"Local Server node call": [local_server_call() for _ in range(args.repeat)],
                "generate --prompt (whole command)": [generate_command(env, tmp) for _ in range(args.repeat)]}
    print(f"{'caller':36} {'median s':>9} {'max s':>7}")
    for name, times in rows.items():
        print(f"{name:36} {statistics.median(times):9.3f} {max(times):7.3f}")
    out = ROOT / "bench" / "out"
    out.mkdir(exist_ok=True)
    (out / "no_gpu_bench.json").write_text(json.dumps({"repeat": args.repeat, "seconds": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
