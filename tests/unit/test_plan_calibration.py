"""planner.memory for a 0.26 server against the committed H200 calibration points
(bench/memory/results/h200-ti2v5b-vllm-omni-0.26.json; 0.30's are in test_memory_model_0_30.py).

Each point is the NVML peak of the real vLLM-Omni 0.26 server for one job; the file says which points
measure their own shape (valid) and why the others do not. Every valid point must stay within the
file's tolerance (10%) of the planner's `peak_gib` for the same configuration and shape.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from vllm_omni_launcher.planner.memory import RequestShape, plan
from vllm_omni_launcher.server.launch.spec import LaunchSpec, MemoryConfig, RuntimeConfig

TI2V = "Wan-AI/Wan2.2-TI2V-5B-Diffusers"
DATA = json.loads((Path(__file__).resolve().parents[2] / "bench" / "memory" / "results" /
                   "h200-ti2v5b-vllm-omni-0.26.json").read_text())
POINTS = {p["id"]: p for p in DATA["points"]}
VALID = [p for p in DATA["points"] if p["valid"]]


def _predicted_gib(point: dict) -> float:
    spec = LaunchSpec(TI2V, gpus=(0,), memory=MemoryConfig(offload=point["offload"], vae_tiling=point["vae_tiling"]),
                      runtime=RuntimeConfig(enforce_eager=point["enforce_eager"]))
    spec.validate()
    return plan(spec, RequestShape(*point["shape"]), [140.4], host_available_gib=None,
                server_version=(0, 26)).peak_gib


def test_file_holds_the_three_tiled_configurations_and_the_untiled_runs():
    assert DATA["tolerance"] == 0.10
    configs = {(p["offload"], p["vae_tiling"]) for p in VALID}
    assert configs == {("none", True), ("layerwise", True), ("module", True), ("none", False)}
    for p in DATA["points"]:   # every point says where it came from and why it counts or not
        assert p["source"].startswith("bench/results/") and p["why"]
        assert p["measured_gib"] == pytest.approx((p["nvml_peak_mib"] - p["not_server_mib"]) / 1024, abs=0.001)


@pytest.mark.parametrize("point", VALID, ids=[p["id"] for p in VALID])
def test_every_valid_point_within_10_percent(point):
    ours = _predicted_gib(point)
    assert abs(ours / point["measured_gib"] - 1) <= DATA["tolerance"], (point["id"], ours, point["measured_gib"])


def test_the_fit_moved_the_tiled_points_that_were_over_predicted():
    """Before the fit the planner over-predicted tiling / layerwise / module at 1280x704x121 by 16-25%."""
    for pid in ("tiling-1280x704x121", "layerwise-1280x704x121", "module-1280x704x121"):
        point = POINTS[pid]
        assert point["planner_before_gib"] / point["measured_gib"] > 1.15
        assert _predicted_gib(point) / point["measured_gib"] < 1.05


def test_masked_points_repeat_an_earlier_peak_of_their_server():
    for p in DATA["points"]:
        if not p["valid"] and "covered_by" not in p:
            same_server = [q for q in DATA["points"] if q["source"].split("#")[0] == p["source"].split("#")[0]
                           and q["offload"] == p["offload"] and q["vae_tiling"] == p["vae_tiling"] and q is not p]
            assert any(q["nvml_peak_mib"] == p["nvml_peak_mib"] for q in same_server), p["id"]


def test_a_smaller_job_after_a_larger_one_stays_within_the_larger_jobs_plan():
    """A server keeps its reserved memory: the carried point is covered by the plan of the largest job it served."""
    carried = [p for p in DATA["points"] if "covered_by" in p]
    assert carried
    for p in carried:
        larger = POINTS[p["covered_by"]]
        assert abs(_predicted_gib(larger) / p["measured_gib"] - 1) <= DATA["tolerance"], p["id"]
