"""Print the README's benchmark table from bench/out/*.json (each a ratio against a reference)."""
from __future__ import annotations

import json
from pathlib import Path

OUT = Path(__file__).resolve().parent / "out"


def _load(name: str) -> dict:
    path = OUT / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else {}


def main() -> None:
    print("| bench | ours | reference | ratio / result |")
    print("|---|---|---|---|")
    dec = _load("decode_bench")
    for row in dec.get("rows", []):
        print(f"| MP4 -> IMAGE {row['case']} | {row['ours_s']['median']:.3f} s | PyAV decode + one float32 write "
              f"{row['floor_s']['median']:.3f} s | {row['ours_s']['median'] / row['floor_s']['median']:.2f}x "
              f"(goal <= {dec.get('goal_ratio', 1.5)}x) |")
    det = _load("detect_bench")
    for row in det.get("rows", []):
        runs = row.get("runs", [])
        if runs:
            delays = sorted(r["in_hand_after_done_s"] for r in runs)
            print(f"| job done -> frames in hand, {row['job_s']:g} s job, poll {row['poll_s']:g} s | "
                  f"median {delays[len(delays) // 2]:.3f} s | job {row['job_s']:g} s | "
                  f"{delays[len(delays) // 2] / row['job_s']:.2f} of the job |")
    ready = _load("ready_bench")
    if ready:
        print(f"| /health 200 -> supervisor ready | max {ready['delay_max_s']:.3f} s | goal {ready['goal_s']} s | "
              f"{'meets' if ready['meets_goal'] else 'misses'} goal |")
    warm = _load("warm_bench")
    if warm:
        first, second = warm["rows"]
        print(f"| second prompt, warm server | {second['total_s']:.2f} s | first prompt {first['total_s']:.2f} s | "
              f"{warm['second_over_first']:.3f}x, relaunched={warm['relaunched']} |")


if __name__ == "__main__":
    main()
