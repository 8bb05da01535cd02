"""Second prompt on a warm server: no relaunch, and its overhead against the first.

The first prompt pays the server start (load, warm-up); the second must reuse the same
process (same generation, same pid) and cost only the job. Measured with the stub server
(real vLLM-Omni HTTP layer) through the same registry call the Local Server node makes.

usage: VLLM_OMNI_LAUNCHER_TEST_SERVER_PYTHON=.venv-server/bin/python python bench/warm_bench.py
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "contract"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="Wan-AI/Wan2.2-TI2V-5B-Diffusers")
    parser.add_argument("--out", default=str(ROOT / "bench" / "out" / "warm_bench.json"))
    args = parser.parse_args()

    from stubserver import STUB_SCRIPT, server_python
    from vllm_omni_launcher.client.api import VideoClient, VideoRequest
    from vllm_omni_launcher.server import registry
    from vllm_omni_launcher.server.config.local_config import load_local_config
    from vllm_omni_launcher.server.launch.spec import LaunchSpec

    os.environ["VLLM_OMNI_LAUNCHER_SERVER_CMD"] = f"{server_python()} {STUB_SCRIPT}"
    os.environ.setdefault("VLLM_OMNI_LAUNCHER_DATA_DIR", tempfile.mkdtemp(prefix="warm-bench-"))
    os.environ["VLLM_OMNI_STUB_STEP_S"] = "0.05"
    spec = LaunchSpec(args.model)
    request = VideoRequest(prompt="a fox", width=64, height=64, num_frames=9, fps=8, steps=10, seed=1)
    rows = []
    try:
        for prompt_no in (1, 2):
            t0 = time.monotonic()
            sup = registry.get_or_start(spec, load_local_config())
            t_ready = time.monotonic()
            with VideoClient(sup.url, api_key=sup.api_key) as client:
                result = client.generate(request)
            rows.append({"prompt": prompt_no, "total_s": time.monotonic() - t0, "server_s": t_ready - t0,
                         "job_s": result.timings["decoded"], "generation": sup.generation,
                         "pid": sup.status().pid})
    finally:
        registry.stop_all()
    first, second = rows
    out = {"bench": "warm_second_prompt", "rows": rows,
           "relaunched": first["pid"] != second["pid"] or first["generation"] != second["generation"],
           "second_over_first": second["total_s"] / first["total_s"],
           "second_server_overhead_s": second["server_s"]}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1))
    print(f"first prompt {first['total_s']:.2f}s (server {first['server_s']:.2f}s), second {second['total_s']:.2f}s "
          f"(server {second['server_s']:.3f}s), relaunched={out['relaunched']}, "
          f"ratio {out['second_over_first']:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
