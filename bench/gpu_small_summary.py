"""The verdict of bench/gpu_small_checks.sh: one SUMMARY line from the three reports it wrote in OUT.

`all_ok` is what issue 25 asks of the real 0.30 server: the fused LoRA pair changes the frames (each
strength against no LoRA, 2.5 against 1.0) with identical runs without LoRA, the per-request PEFT
LoRA changes them and euler runs, and two replicas on GPU 0 each run jobs and leave nothing after
Stop. `stub_provable_ok` is the part a CPU rehearsal against tests/contract/stub_vllm_serve.py can
prove: the stub loads no weights and its frames depend on the seed only, so there a LoRA or a
sampler never changes them. Standard library only (it runs under the server's python).

usage: python bench/gpu_small_summary.py OUT
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def load(folder: Path, name: str) -> dict[str, Any]:
    try:
        return json.loads((folder / name).read_text())
    except (OSError, ValueError) as exc:
        return {"missing": str(exc)}


def replica_checks(report: dict[str, Any]) -> dict[str, bool]:
    """Both replica processes seen, jobs on each replica, no process left after Stop (every setting)."""
    rows = {row.get("replicas"): row for row in report.get("results", [])}
    two = rows.get(2, {})
    return {"two_replica_processes": len(two.get("processes", {}).get("replica_pids", [])) == 2,
            "jobs_on_each_replica": sorted(two.get("jobs_per_replica", {})) == ["0", "1"],
            "nothing_left_after_stop": bool(rows) and all(
                row.get("processes", {}).get("left_after_stop") == [] for row in rows.values())}


def summary(folder: Path) -> dict[str, Any]:
    fused, peft = load(folder, "fused-lora.json"), load(folder, "peft-lora.json")
    replicas = load(folder, "replicas-tiny-ti2v.json")
    checks = replica_checks(replicas)
    served = [s for s in fused.get("servers", {}).values() if s.get("jobs") and "error" not in s]
    rows = replicas.get("results", [])
    return {
        "all_ok": bool(fused.get("ok")) and bool(peft.get("ok")) and all(checks.values()),
        "stub_provable_ok": {
            "fused": len(served) == 3 and all(bool(fused.get(k)) for k in
                                             ("started_with_flags", "scaled_copies_fused", "deterministic")),
            "peft": bool(peft.get("deterministic")) and bool(peft.get("euler_ran")) and "error" not in peft,
            "replicas": all(checks.values())},
        "fused": {k: fused.get(k) for k in ("stub", "started_with_flags", "scaled_copies_fused", "fused_in_log",
                                            "deterministic", "lora_changes_frames", "strength_changes_frames",
                                            "diff", "ok", "interrupted", "missing")},
        "peft": {k: peft.get(k) for k in ("server_version", "deterministic", "lora_changes_frames", "euler_ran",
                                          "euler_changes_frames", "diff", "ok", "error", "missing")},
        "replicas": {"server_versions": replicas.get("server_versions"), **checks,
                     "jobs_per_min": {row.get("replicas"): row.get("jobs_per_min") for row in rows},
                     "errors": {row.get("replicas"): row.get("error") or row.get("skipped") for row in rows
                                if row.get("error") or row.get("skipped")},
                     "missing": replicas.get("missing")},
    }


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    result = summary(Path(argv[0]))
    print("SUMMARY", json.dumps(result, indent=1))
    return 0 if result["all_ok"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
