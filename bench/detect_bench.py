"""Server done -> seen done, for what a plain VideoClient.generate() (and `generate --url`) gets.

Runs the stub server (real vLLM-Omni 0.30 HTTP layer, fake engine; tests/contract/stubserver.py)
with VLLM_OMNI_STUB_STEP_S, so a job lasts steps x step_s seconds. An observer thread polls the
same job every 5 ms to timestamp its completion on our clock; per job the bench reports
`detect_s` (the client's first poll that saw it completed, minus that timestamp),
`in_hand_after_done_s` (frames in hand minus that timestamp) and how many status requests the
client sent. Modes, run on the same server in the same run:

  fixed   a poll every 0.25 s (the client's record of earlier jobs is forgotten before each job)
  plain   what a plain generate() gets now: the first job of a kind at 0.25 s polls, later ones
          with the fast-poll window at the time earlier jobs of that kind took (client/poll_window.py)
  hint    plain + a `due()` that turns true `--hint-before` seconds before the job's end (what the
          node and `generate` without --url get from a supervised server's last denoise step)

    VLLM_OMNI_LAUNCHER_TEST_SERVER_PYTHON=.venv-server/bin/python \\
        .venv/bin/python bench/detect_bench.py [--jobs 1,3] [--repeat 4] [--hint-before 0.3]

Prints a table (medians over the jobs after the first of each mode and length) and writes
bench/out/detect_bench.json.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "contract"))
import stubserver  # noqa: E402

from vllm_omni_launcher.client import poll_window  # noqa: E402
from vllm_omni_launcher.client.api import VideoClient, VideoRequest  # noqa: E402
from vllm_omni_launcher.client.job_results import JobUpdate  # noqa: E402

MODEL = "Wan-AI/Wan2.2-TI2V-5B-Diffusers"
STEP_S = 0.05
MODES = ("fixed", "plain", "hint")


class Observer:
    """Polls one job every `every` s and records when it is first seen completed."""

    def __init__(self, url: str, every: float = 0.005) -> None:
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


def one_run(url: str, steps: int, seed: int, mode: str, hint_before: float) -> dict[str, Any]:
    if mode == "fixed":
        poll_window.LEARNED.clear()
    client = VideoClient(url)
    observer = Observer(url)
    polls = [0]

    def on_update(update: JobUpdate) -> None:
        polls[0] += 1
        observer.watch(update)

    job_s = steps * STEP_S
    t0 = time.monotonic()
    due: Optional[Callable[[], bool]] = (lambda: time.monotonic() >= t0 + job_s - hint_before) \
        if mode == "hint" else None
    req = replace(REQUEST, seed=seed, steps=steps)
    result = client.generate(req, on_update=on_update, keep_job=True, due=due)
    in_hand = t0 + result.timings["decoded"]
    observer.stop()
    client.delete(result.job_id)
    done = observer.completed_at
    return {"mode": mode, "steps": steps, "job_s": job_s, "status_requests": polls[0],
            "detect_s": (t0 + result.timings["job_done"] - done) if done else None,
            "in_hand_after_done_s": (in_hand - done) if done else None, "timings": result.timings}


REQUEST = VideoRequest("bench", width=256, height=128, num_frames=9, fps=16, seed=0, steps=1)


def median(values: list[Optional[float]]) -> Optional[float]:
    found = [v for v in values if v is not None]
    return round(statistics.median(found), 4) if found else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", default="1,3", help="job lengths in seconds (comma list)")
    parser.add_argument("--repeat", type=int, default=4, help="jobs per mode and length (the first has no record)")
    parser.add_argument("--hint-before", type=float, default=0.3,
                        help="hint mode: due() turns true this long before the job's end (VAE decode + encode)")
    parser.add_argument("--out", default=str(ROOT / "bench" / "out" / "detect_bench.json"))
    args = parser.parse_args()
    lengths = [float(x) for x in args.jobs.split(",") if x]
    rows = []
    with stubserver.run_stub(MODEL, env={"VLLM_OMNI_STUB_STEP_S": str(STEP_S)}) as handle:
        handle.wait_healthy(300)
        for length in lengths:
            steps = max(1, round(length / STEP_S))
            for mode in MODES:
                poll_window.LEARNED.clear()
                runs = [one_run(handle.url, steps, seed, mode, args.hint_before) for seed in range(args.repeat)]
                later = runs[1:] or runs
                rows.append({"job_s": length, "mode": mode, "runs": runs,
                             "first_detect_s": runs[0]["detect_s"],
                             "median_detect_s": median([r["detect_s"] for r in later]),
                             "median_in_hand_after_done_s": median([r["in_hand_after_done_s"] for r in later]),
                             "median_status_requests": median([r["status_requests"] for r in later])})
    print(f"\n{'job s':>6} {'mode':>6} {'first detect s':>15} {'detect s':>9} {'done->frames s':>15} {'polls':>6}")
    for r in rows:
        cells = [r["first_detect_s"], r["median_detect_s"], r["median_in_hand_after_done_s"]]
        text = [f"{c:.3f}" if c is not None else "-" for c in cells]
        print(f"{r['job_s']:6.1f} {r['mode']:>6} {text[0]:>15} {text[1]:>9} {text[2]:>15} "
              f"{r['median_status_requests'] or 0:6.0f}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"bench": "detect", "step_s": STEP_S, "hint_before_s": args.hint_before,
                               "fast_poll_s": poll_window.FAST_POLL_S, "fast_window_s": poll_window.FAST_WINDOW_S,
                               "rows": rows}, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
