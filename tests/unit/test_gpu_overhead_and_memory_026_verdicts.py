"""Issue 25's device verdicts, from the reports the device calls write (bench/gpu/issue25.sh):

* the overhead verdict (bench/gpu/overhead_verdict.py): the CLI's part of a job is read from each CLI job of the
  `levers --cli-jobs` report; the node's is the Generate Video node's seconds minus the job's own `inference_time_s`
  where the run has it (direct), else minus the server's logged parts and the server's rest (the median, over the
  CLI call's jobs, of `inference_time_s` minus those parts), each row naming its method; the verdict is
  "under 0.3 s" only when every measured job of both paths is, and there is none while a path has no measured job;
* the 0.26 memory verdict (bench/gpu/memory26_verdict.py): a calibrate report's jobs count under the committed 0.26
  points' validity rule, are predicted with the 0.26 line's coefficients, and the verdict is "within 10%" only when
  every valid held-back point is, on a server that is really 0.26.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.gpu import memory26_verdict as m26
from bench.gpu import overhead_verdict as ov

STAGES = {"pipeline_s": 10.0}


def _lever_job(via: str, steps: int, ours: float, inference: float = 11.5, ok: bool = True) -> dict:
    return {"config": "eager", "steps": steps, "via": via, "ok": ok, "ours_s": ours,
            "timings": {"server_inference": inference, "decoded": inference + ours},
            "server_stages": STAGES, "postprocess_s": 0.9, "mp4_encode_s": 0.4}


def _levers(*jobs: dict) -> dict:
    return {"configs": [{"config": "eager", "jobs": list(jobs)}]}


def _node_run(label: str, node_s: float, status: str = "success", stages: dict | None = STAGES) -> dict:
    return {"side": "ours", "run": label, "steps": 4, "status": status, "node_s": {"5": node_s, "2": 40.0},
            "server_stages": stages, "server_postprocess_s": 0.9, "server_mp4_encode_s": 0.4}


def test_cli_overhead_is_each_cli_jobs_own_and_the_first_cli_job_at_its_steps_is_marked():
    rows = ov.cli_rows(_levers(_lever_job("client", 4, 0.4), _lever_job("cli", 4, 0.25), _lever_job("cli", 4, 0.19),
                               _lever_job("cli", 20, 0.2), {"steps": 4, "via": "cli", "skipped": "device call time"}))
    assert [(r["steps"], r["first_cli_at_its_steps"], r["ours_s"]) for r in rows] == [(4, True, 0.25), (4, False, 0.19),
                                                                              (20, True, 0.2)]


def test_the_cli_processs_own_job_is_the_first_of_a_fresh_server_and_counts_when_timed():
    row = ov.cli_first_row({"timings": {"server_inference": 15.0, "decoded": 15.21, "submit": 0.01}})
    assert row["path"] == "cli" and row["ok"] and row["ours_s"] == pytest.approx(0.21)
    assert ov.cli_first_row({}) is None
    assert ov.cli_first_row({"timings": {"decoded": 15.2}})["ok"] is False       # no inference_time_s: not measured


def test_server_rest_is_the_median_of_inference_time_minus_the_logged_parts():
    levers = _levers(_lever_job("client", 4, 0.4, inference=11.5), _lever_job("cli", 4, 0.2, inference=11.6),
                     _lever_job("cli", 4, 0.2, inference=12.3), _lever_job("cli", 4, 0.2, inference=99.0, ok=False))
    assert ov.server_rest_s(levers) == pytest.approx(0.3)        # 11.6 - (10 + 0.9 + 0.4); the failed job is out
    assert ov.server_rest_s(_levers(dict(_lever_job("cli", 4, 0.2), postprocess_s=None))) is None


def test_node_overhead_is_the_generate_nodes_seconds_minus_the_servers_parts_and_rest():
    native = {"runs": [_node_run("first", 11.85), _node_run("eager-4", 11.7),
                       {"side": "native", "run": "first", "status": "success", "node_s": {"5": 1.0}}]}
    rows = ov.node_rows(native, "5", rest_s=0.15)
    assert [(r["run"], r["ok"], r["ours_s"]) for r in rows] == [("first", True, 0.4), ("eager-4", True, 0.25)]
    assert {r["method"] for r in rows} == {"stage parts and median rest"}     # no job time in these runs


def test_a_node_run_with_the_jobs_own_server_time_is_measured_directly_whatever_the_rest():
    # 11.7 s of node minus the job's own 11.42 s: not 11.7 - 11.3 - the median 0.15 the estimate would give
    native = {"runs": [dict(_node_run("eager-4", 11.7), server_inference_s=11.42), _node_run("first", 11.85),
                       dict(_node_run("eager-20", 11.9, stages=None), server_inference_s=11.6)]}
    rows = ov.node_rows(native, "5", rest_s=0.15)
    assert [(r["run"], r["ok"], r["method"], r["ours_s"]) for r in rows] == [
        ("eager-4", True, "direct", 0.28), ("first", True, "stage parts and median rest", 0.4),
        ("eager-20", True, "direct", 0.3)]     # no stage line needed where the job's own time is there
    assert [(r["ok"], r["ours_s"]) for r in ov.node_rows({"runs": native["runs"][:1]}, "5", rest_s=None)] == [
        (True, 0.28)]                          # nor a server rest
    failed = dict(_node_run("eager-4", 11.7, status="error"), server_inference_s=11.42)
    assert [r["ok"] for r in ov.node_rows({"runs": [failed]}, "5", rest_s=0.15)] == [False]


def test_a_node_run_without_the_servers_timing_line_or_rest_is_not_measured():
    native = {"runs": [_node_run("first", 11.85, stages=None), _node_run("eager-4", 11.7, status="error")]}
    assert [r["ok"] for r in ov.node_rows(native, "5", rest_s=0.15)] == [False, False]
    assert [r["ok"] for r in ov.node_rows({"runs": [_node_run("first", 11.85)]}, "5", rest_s=None)] == [False]


def test_a_job_whose_worker_wrote_the_mp4_counts_its_pipeline_as_all_the_servers_logged_parts():
    assert ov.server_parts_s(STAGES, 0.0, None) == pytest.approx(10.0)        # preencode_mp4: no encode line
    assert ov.server_parts_s(STAGES, 0.9, None) is None                       # a plain job's encode line missing
    native = {"runs": [dict(_node_run("eager-4", 10.35), server_postprocess_s=0.0, server_mp4_encode_s=None)]}
    assert [(r["ok"], r["ours_s"]) for r in ov.node_rows(native, "5", rest_s=0.05)] == [(True, 0.3)]


def test_without_a_levers_call_the_rest_comes_from_another_report_and_the_cli_rows_from_the_cli_process(tmp_path):
    other = tmp_path / "levers.json"
    other.write_text(json.dumps(_levers(_lever_job("cli", 4, 0.2, inference=11.6), _lever_job("cli", 4, 0.25, inference=11.6))))
    native, first = tmp_path / "report.json", tmp_path / "first.json"
    native.write_text(json.dumps({"runs": [_node_run("eager-4", 11.8)]}))
    first.write_text(json.dumps({"timings": {"server_inference": 15.0, "decoded": 15.1}}))
    assert ov.main(["--rest-from", str(other), "--native", str(native), "--cli-first", str(first),
                    "--generate-node", "5", "--out", str(tmp_path / "v")]) == 0
    doc = json.loads((tmp_path / "v" / "overhead-verdict.json").read_text())
    assert doc["server_rest_s"] == pytest.approx(0.3) and doc["rest_from"] == str(other)
    assert [(r["path"], r["ours_s"]) for r in doc["rows"]] == [("cli", 0.1), ("node", 0.2)]   # 11.8 - 11.3 - 0.3
    with pytest.raises(SystemExit):
        ov.main(["--native", str(native), "--out", str(tmp_path / "w")])


def _rows(cli: list[float], node: list[float]) -> list[dict]:
    return ([{"path": "cli", "ok": True, "ours_s": x} for x in cli]
            + [{"path": "node", "ok": True, "ours_s": x} for x in node])


def test_the_verdict_is_under_only_when_every_cli_and_node_job_is_under_the_limit():
    good = ov.verdict(_rows([0.19, 0.21], [0.25, 0.29]))
    assert good["under_limit"] is True and good["line"].startswith("OVERHEAD VERDICT: under 0.3 s")
    assert good["cli"]["max_s"] == 0.21 and good["node"]["max_s"] == 0.29
    for cli, node in (([0.19, 0.34], [0.25]), ([0.19], [0.25, 0.3])):
        bad = ov.verdict(_rows(cli, node))
        assert bad["under_limit"] is False and bad["line"].startswith("OVERHEAD VERDICT: NOT under 0.3 s")


def test_no_overhead_verdict_while_a_path_has_no_measured_job():
    rows = _rows([0.19], []) + [{"path": "node", "ok": False, "ours_s": None}]
    out = ov.verdict(rows)
    assert out["under_limit"] is None and out["line"] == "OVERHEAD VERDICT: none (no measured node job)"
    assert out["node"]["failed"] == 1


def test_the_overhead_command_writes_its_verdict_file(tmp_path: Path, capsys):
    (tmp_path / "levers.json").write_text(json.dumps(_levers(_lever_job("client", 4, 0.3, inference=11.45),
                                                             _lever_job("cli", 4, 0.12, inference=11.45))))
    (tmp_path / "report.json").write_text(json.dumps({"runs": [_node_run("first", 11.6)]}))
    (tmp_path / "first.json").write_text(json.dumps({"timings": {"server_inference": 15.0, "decoded": 15.34}}))
    args = ["--levers", str(tmp_path / "levers.json"), "--native", str(tmp_path / "report.json"),
            "--generate-node", "5", "--out", str(tmp_path / "v")]
    assert ov.main(args) == 0
    doc = json.loads((tmp_path / "v" / "overhead-verdict.json").read_text())
    assert doc["server_rest_s"] == pytest.approx(0.15) and doc["node"]["max_s"] == pytest.approx(0.15)
    assert doc["under_limit"] is True and doc["line"] in capsys.readouterr().out
    assert ov.main(args + ["--cli-first", str(tmp_path / "first.json")]) == 0     # the fresh server's job: 0.34 s
    doc = json.loads((tmp_path / "v" / "overhead-verdict.json").read_text())
    assert doc["under_limit"] is False and doc["cli"] == {"jobs": 2, "max_s": 0.34, "failed": 0}


# ------------------------------------------------------------------------------------------- 0.26 memory
def _job(shape: list[int], peak, ok: bool = True, cap=None) -> dict:
    return {"shape": shape, "ok": ok, "nvml_peak_mib": peak, "cap_gib": cap, **({} if ok else {"error": "OOM"})}


def _config(name: str, offload: str, tiling: bool, *jobs: dict) -> dict:
    return {"config": name, "offload": offload, "vae_tiling": tiling, "jobs": list(jobs)}


def test_points_follow_the_026_files_validity_rule():
    report = {"configs": [
        _config("tiling", "none", True, _job([832, 480, 81], 20000), _job([1024, 576, 97], 22000),
                _job([1024, 576, 97], 22000), _job([832, 480, 49], 30000, cap=15.25)),
        _config("none", "none", False, _job([1280, 704, 121], 48000), _job([832, 480, 81], 40000)),
        _config("module_tiling", "module", True, _job([832, 480, 81], None, ok=False), _job([1024, 576, 97], 18000),
                {"shape": [1024, 576, 97], "skipped": "device call time"})]}
    got = [(p["config"], tuple(p["shape"]), p["valid"]) for p in m26.points(report)]
    assert got == [("tiling", (832, 480, 81), True), ("tiling", (1024, 576, 97), True),     # first; rises above
                   ("tiling", (1024, 576, 97), False),                                      # repeats a peak
                   ("none", (1280, 704, 121), False), ("none", (832, 480, 81), False),      # fitted; below it
                   ("module_tiling", (832, 480, 81), False), ("module_tiling", (1024, 576, 97), True)]


V026 = {"vllm": "0.26.0", "vllm_omni": "0.26.0"}


def _valid(config: str, mib: int) -> dict:
    return {"config": config, "offload": "none", "vae_tiling": True, "shape": [832, 480, 81], "nvml_peak_mib": mib,
            "valid": True, "why": "first job of its server"}


def test_the_memory_verdict_is_within_only_when_every_valid_point_is_within_10_percent():
    predict = lambda *_: 22.0    # noqa: E731  (GiB)
    ok = m26.verdict([_valid("tiling", 21 * 1024), _valid("module_tiling", 24 * 1024)], V026, predict)
    assert ok["within"] is True and ok["line"].startswith("MEM26 VERDICT: within 10%: 2 held-back points")
    bad = m26.verdict([_valid("tiling", 21 * 1024), _valid("none", 19 * 1024)], V026, predict)
    assert bad["within"] is False and "worst none 832x480x81 +15.8%" in bad["line"]


def test_no_memory_verdict_on_a_server_that_is_not_026_or_without_a_valid_point():
    predict = lambda *_: 22.0    # noqa: E731
    other = m26.verdict([_valid("tiling", 22 * 1024)], {"vllm": "0.30.0", "vllm_omni": "0.30.0"}, predict)
    assert other["within"] is None and "not 0.26" in other["line"]
    assert m26.verdict([], {}, predict)["within"] is None
    none = m26.verdict([dict(_valid("tiling", 1), valid=False)], V026, predict)
    assert none["line"] == "MEM26 VERDICT: none (no valid held-back point)"


def test_the_prediction_uses_the_026_lines_coefficients():
    """0.26 keeps 0.6 of the untiled decode reserved on top: the committed 0.26 untiled 1280x704x121 point
    (48.07 GiB NVML) is met by the 0.26 prediction, not by the pinned 0.30 one."""
    from vllm_omni_launcher.planner.memory import RequestShape, plan
    from vllm_omni_launcher.server.launch.spec import LaunchSpec, MemoryConfig, RuntimeConfig

    ours = m26.predict_026("none", False, (1280, 704, 121))
    assert abs(ours / 48.069 - 1) <= 0.10
    spec = LaunchSpec("Wan-AI/Wan2.2-TI2V-5B-Diffusers", gpus=(0,), memory=MemoryConfig(vae_tiling=False),
                      runtime=RuntimeConfig(enforce_eager=True))
    assert plan(spec, RequestShape(1280, 704, 121), [140.4], host_available_gib=None,
                server_version=(0, 30)).peak_gib < ours - 3.0


def test_the_memory_command_writes_its_verdict_file(tmp_path: Path, capsys):
    report = {"configs": [_config("tiling", "none", True, _job([832, 480, 81], None, ok=False))]}
    (tmp_path / "calibration.json").write_text(json.dumps(report))
    (tmp_path / "versions.json").write_text(json.dumps(V026))
    assert m26.main([str(tmp_path / "calibration.json"), "--versions", str(tmp_path / "versions.json"),
                     "--out", str(tmp_path / "v")]) == 0
    doc = json.loads((tmp_path / "v" / "mem26-verdict.json").read_text())
    assert doc["within"] is None and doc["points"][0]["why"].startswith("no peak: OOM")
    assert "MEM26 VERDICT: none (no valid held-back point)" in capsys.readouterr().out
