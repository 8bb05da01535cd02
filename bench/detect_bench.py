"""Job finished -> frames in hand: VideoClient.generate (0.25 s polls) vs a 5 s polling client.

Runs the stub server (real vLLM-Omni 0.30 HTTP layer, fake engine; tests/contract/stubserver.py)
with VLLM_OMNI_STUB_STEP_S, so a job lasts steps x step_s seconds. For each job length and
client, an observer thread polls the same job every 20 ms to timestamp the server-side
completion on our clock; the delay reported is frames-in-hand minus that timestamp.

    VLLM_OMNI_LAUNCHER_TEST_SERVER_PYTHON=/tmp/senv/bin/python \\
        /tmp/uenv/bin/python bench/detect_bench.py [--jobs 1,3] [--repeat 2]

Prints a table and writes bench/out/detect_bench.json.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "contract"))
import stubserver  # noqa: E402

from vllm_omni_launcher.client.api import VideoClient, VideoRequest  # noqa: E402
from vllm_omni_launcher.client.job_results import JobUpdate  # noqa: E402

MODEL = "Wan-AI/Wan2.2-TI2V-5B-Diffusers"
STEP_S = 0.05


class Observer:
    """Polls one job every `every` s and records when it is first seen completed."""

    def __init__(self, url: str, every: float = 0.02) -> None:
        self.client = VideoClient(url)
        self.every = every
        self.job_id: Optional[str] = None
        self.completed_at: Optional[float] = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def watch(self, update: JobUpdate) -> None:
        if self.job_id is None:
            self.job_id = update.job_id

    def _run(self) -> None:
        while not self._stop.is_set() and self.completed_at is None:
            if self.job_id is not None:
                try:
                    if self.client.status(self.job_id).status in ("completed", "failed"):
                        self.completed_at = time.monotonic()
                        return
                except Exception:  # noqa: BLE001 - job deleted by the client after completion
                    return
            time.sleep(self.every)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


def one_run(url: str, steps: int, poll: float, seed: int) -> dict[str, Any]:
    client = VideoClient(url)
    observer = Observer(url)
    req = VideoRequest("bench", width=256, height=128, num_frames=9, fps=16, seed=seed, steps=steps)
    t0 = time.monotonic()
    result = client.generate(req, on_update=observer.watch, poll_interval=poll, keep_job=True)
    in_hand = t0 + result.timings["decoded"]
    observer.stop()
    client.delete(result.job_id)
    done = observer.completed_at
    return {"poll_s": poll, "steps": steps, "job_s": steps * STEP_S,
            "detect_s": (t0 + result.timings["job_done"] - done) if done else None,
            "in_hand_after_done_s": (in_hand - done) if done else None,
            "timings": result.timings}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", default="1,3", help="job lengths in seconds (comma list)")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--out", default=str(ROOT / "bench" / "out" / "detect_bench.json"))
    args = parser.parse_args()
    lengths = [float(x) for x in args.jobs.split(",") if x]
    rows = []
    with stubserver.run_stub(MODEL, env={"VLLM_OMNI_STUB_STEP_S": str(STEP_S)}) as handle:
        handle.wait_healthy(300)
        for length in lengths:
            steps = max(1, round(length / STEP_S))
            for poll in (0.25, 5.0):
                runs = [one_run(handle.url, steps, poll, seed) for seed in range(args.repeat)]
                delays = [r["in_hand_after_done_s"] for r in runs if r["in_hand_after_done_s"] is not None]
                rows.append({"job_s": length, "poll_s": poll, "runs": runs,
                             "median_in_hand_after_done_s": statistics.median(delays) if delays else None})
    print(f"\n{'job s':>6}{'poll s':>8}{'done->frames s (median)':>26}")
    for r in rows:
        med = r["median_in_hand_after_done_s"]
        print(f"{r['job_s']:6.1f}{r['poll_s']:8.2f}{(f'{med:.3f}' if med is not None else '-'):>26}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"bench": "detect", "step_s": STEP_S, "rows": rows}, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
