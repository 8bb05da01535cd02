"""The planner's vLLM-Omni 0.26 memory model against the real 0.26 server at shapes its fit never used (issue 25's
"0.26 still within 10%"), from bench/results/h100-issue25-remainder-vllm-omni-0.30/ (`mem26/calibration.json`: no
offload, tiling, layerwise + tiling and module + tiling, each its own 0.26 server on one H100, at 832x480x81 and
1024x576x97; `versions26.json`: that server venv).

Each job counts under the committed 0.26 points' validity rule and is predicted with the 0.26 line's coefficients
by bench/gpu/memory26_verdict.py, the module that wrote the run's verdict; these tests hold the committed report
to it, so a change of the 0.26 coefficients that breaks a held-back point fails here.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.gpu import memory26_verdict as m26

RESULTS = Path(__file__).resolve().parents[2] / "bench/results/h100-issue25-remainder-vllm-omni-0.30"
CALIBRATION = json.loads((RESULTS / "mem26/calibration.json").read_text())
VERSIONS = json.loads((RESULTS / "versions26.json").read_text())
VALID = [p for p in m26.points(CALIBRATION) if p["valid"]]
CONFIGS = {"none", "tiling", "layerwise_tiling", "module_tiling"}
SHAPES = {(832, 480, 81), (1024, 576, 97)}


def _ids(point: dict) -> str:
    return f"{point['config']}-{'x'.join(map(str, point['shape']))}"


@pytest.mark.parametrize("point", VALID, ids=[_ids(p) for p in VALID])
def test_each_held_back_point_of_the_0_26_server_is_within_10_percent(point):
    doc = m26.verdict([dict(point)], VERSIONS)
    judged = doc["points"][0]
    assert doc["within"] is True and abs(judged["error"]) <= m26.TOLERANCE, judged
    assert judged["measured_gib"] == round(point["nvml_peak_mib"] / 1024, 3)


def test_every_configuration_at_both_shapes_is_a_valid_point_the_fit_never_used():
    assert {(p["config"], tuple(p["shape"])) for p in VALID} == {(c, s) for c in CONFIGS for s in SHAPES}
    assert not SHAPES & m26.FITTED_SHAPES


def test_the_run_was_on_vllm_omni_0_26_and_the_committed_verdict_is_what_the_module_says_now():
    assert VERSIONS["vllm"].startswith("0.26.") and VERSIONS["vllm_omni"].startswith("0.26.")
    doc = m26.verdict(m26.points(CALIBRATION), VERSIONS)
    committed = json.loads((RESULTS / "mem26/mem26-verdict.json").read_text())
    assert doc["within"] is True and doc["line"] == committed["line"]
    assert doc["line"].startswith("MEM26 VERDICT: within 10%: 8 held-back points")


def test_the_0_26_coefficients_not_the_0_30_ones_made_the_predictions():
    """calibrate's own `planner_peak_gib` is the pinned 0.30 line's: without offload and under layerwise offload
    0.26 plans more (the untiled decode term, the resident text encoder), so the verdict did not judge 0.30."""
    doc = m26.verdict(m26.points(CALIBRATION), VERSIONS)
    pinned = {(c["config"], tuple(j["shape"])): j["planner_peak_gib"]
              for c in CALIBRATION["configs"] for j in c["jobs"]}
    for p in doc["points"]:
        if p["config"] in ("none", "layerwise_tiling"):
            assert p["predicted_gib"] > pinned[(p["config"], tuple(p["shape"]))] + 2.0, p
