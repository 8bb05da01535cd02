"""Issue 25's "0.26 still within 10%": the planner's 0.26 memory model against the real 0.26 server at held-back
shapes.

Reads a `calibrate` report (bench/gpu/calibrate.py) of a run on the vLLM-Omni 0.26 server and predicts each job
again with the 0.26 line's coefficients (`plan(..., server_version=(0, 26))`: calibrate's own `planner_peak_gib`
is the pinned line's, 0.30). A job counts as a point under the rule of the committed 0.26 points
(bench/memory/results/h200-ti2v5b-vllm-omni-0.26.json, `validity_rule`): the first job of its server, or a later
one whose NVML peak exceeds every earlier job's of that server (the allocator keeps what a job reserved, so a
later job that does not rise above them only repeats or carries an earlier peak; calibrate runs the shapes in
ascending token order). Only shapes the 0.26 fit did not use count (all of
its points are 1280x704 at 61 or 121 frames). The verdict line says within 10% or not, or why there is none.

    python -m bench.gpu.memory26_verdict CALIBRATION.json --versions VERSIONS.json --out DIR
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Callable, Optional

TOLERANCE = 0.10
FITTED_SHAPES = {(1280, 704, 121), (1280, 704, 61)}   # the 0.26 fit's shapes: never a held-back point
LINE = (0, 26)


def points(report: dict) -> list[dict[str, Any]]:
    """Each finished uncapped job of every configuration, marked valid or not, with the reason."""
    out = []
    for config in report.get("configs", []):
        earlier: list[int] = []
        for job in config.get("jobs", []):
            peak = job.get("nvml_peak_mib")
            if job.get("skipped") or job.get("cap_gib") is not None:
                continue
            shape = tuple(job.get("shape", ()))
            point = {"config": config.get("config"), "offload": config.get("offload"),
                     "vae_tiling": config.get("vae_tiling"), "shape": list(shape), "nvml_peak_mib": peak}
            if not job.get("ok") or not isinstance(peak, int):
                point.update(valid=False, why="no peak: " + (job.get("error") or "no NVML (CPU)")[:200])
            elif shape in FITTED_SHAPES:
                point.update(valid=False, why="a shape the 0.26 fit used")
            elif not earlier:
                point.update(valid=True, why="first job of its server")
            elif peak <= max(earlier):
                point.update(valid=False, why="masked: no higher than an earlier job's peak on its server")
            else:
                point.update(valid=True, why="later job whose peak exceeds every earlier job's")
            if isinstance(peak, int):
                earlier.append(peak)
            out.append(point)
    return out


def predict_026(offload: str, vae_tiling: bool, shape: tuple[int, int, int]) -> float:
    """The planner's peak for one eager GPU with the 0.26 line's coefficients (as tests/unit/test_plan_calibration)."""
    from vllm_omni_launcher.planner.memory import RequestShape, plan
    from vllm_omni_launcher.server.launch.spec import LaunchSpec, MemoryConfig, RuntimeConfig

    spec = LaunchSpec("Wan-AI/Wan2.2-TI2V-5B-Diffusers", gpus=(0,),
                      memory=MemoryConfig(offload=offload, vae_tiling=vae_tiling),
                      runtime=RuntimeConfig(enforce_eager=True))
    spec.validate()
    return plan(spec, RequestShape(*shape), [140.4], host_available_gib=None, server_version=LINE).peak_gib


def verdict(pts: list[dict[str, Any]], versions: dict[str, str],
            predict: Callable[[str, bool, tuple[int, int, int]], float] = predict_026) -> dict[str, Any]:
    """Within TOLERANCE on every valid held-back point of a 0.26 server; no verdict without one or on another
    server line."""
    line = ".".join(str(x) for x in LINE)
    for p in pts:
        if p["valid"]:
            p["predicted_gib"] = round(predict(p["offload"], p["vae_tiling"], tuple(p["shape"])), 3)
            p["measured_gib"] = round(p["nvml_peak_mib"] / 1024, 3)
            p["error"] = round(p["predicted_gib"] / p["measured_gib"] - 1, 4)
    valid = [p for p in pts if p["valid"]]
    out: dict[str, Any] = {"tolerance": TOLERANCE, "versions": versions, "points": pts}
    server = [versions.get("vllm", "?"), versions.get("vllm_omni", "?")]
    if not all(v.startswith(line + ".") for v in server):
        out["within"], why = None, f"the server is vllm {server[0]} + vllm-omni {server[1]}, not {line}"
    elif not valid:
        out["within"], why = None, "no valid held-back point"
    else:
        worst = max(valid, key=lambda p: abs(p["error"]))
        out["within"] = all(abs(p["error"]) <= TOLERANCE for p in valid)
        out["line"] = (f"MEM26 VERDICT: {'within' if out['within'] else 'NOT within'} {TOLERANCE:.0%}: "
                       f"{len(valid)} held-back points, worst {worst['config']} "
                       f"{'x'.join(map(str, worst['shape']))} {worst['error']:+.1%} "
                       f"(planned {worst['predicted_gib']} GiB, NVML {worst['measured_gib']} GiB)")
        return out
    out["line"] = f"MEM26 VERDICT: none ({why})"
    return out


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.gpu.memory26_verdict", description=__doc__.splitlines()[0])
    p.add_argument("calibration", help="calibration.json of the calibrate call on the 0.26 server")
    p.add_argument("--versions", required=True, help='JSON {"vllm": ..., "vllm_omni": ...} of that server venv')
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    from .common import import_package

    import_package()
    report = json.loads(Path(a.calibration).read_text()) if Path(a.calibration).is_file() else {}
    versions = json.loads(Path(a.versions).read_text()) if Path(a.versions).is_file() else {}
    doc = verdict(points(report), versions)
    Path(a.out).mkdir(parents=True, exist_ok=True)
    (Path(a.out) / "mem26-verdict.json").write_text(json.dumps(doc, indent=1))
    for pt in doc["points"]:
        print(f"  {pt['config']} {'x'.join(map(str, pt['shape']))}: {pt['why']}"
              + (f"; planned {pt['predicted_gib']} GiB, NVML {pt['measured_gib']} GiB ({pt['error']:+.1%})"
                 if pt["valid"] else ""))
    print(doc["line"], flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
