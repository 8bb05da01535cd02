"""The pure parts of the A14B one-GPU bench (bench/gpu_a14b.py), its README generator
(bench/gpu_a14b_table.py) and the full-size builder's disk sharing (bench/make_fullsize_a14b.py).
The device phases themselves are rehearsed by `bash bench/gpu_session.sh cpu-a14b` (stub server)."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parents[2]


def _load(name: str):
    sys.path.insert(0, str(REPO / "bench"))
    spec = importlib.util.spec_from_file_location(name, REPO / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(name, module)   # dataclasses look their module up while the file runs
    spec.loader.exec_module(module)
    return module


bench = _load("gpu_a14b")
table = _load("gpu_a14b_table")
builder = _load("make_fullsize_a14b")

TIMINGS = {"submit": 0.01, "job_done": 40.2, "downloaded": 40.3, "decoded": 40.5, "server_inference": 40.0}


def test_plan_repeats_the_first_request_then_runs_the_rest_in_order():
    jobs = bench.job_plan(bench.parse_shapes("832x480x81,1280x720x81"), ["default", "1"])
    assert [(j.shape, j.guidance, j.repeat_of_first) for j in jobs] == [
        ("832x480x81", "default", False), ("832x480x81", "default", True), ("832x480x81", "1", False),
        ("1280x720x81", "default", False), ("1280x720x81", "1", False)]
    assert jobs[0].cfg and not jobs[2].cfg and bench.Job(64, 64, 9, "3.5").cfg


def test_prior_matches_the_measured_720p_job_and_scales_down():
    big = bench.Job(1280, 720, 81, "default")
    assert big.tokens() == bench.PRIOR_TOKENS == 75600
    assert abs(bench.prior_s(big, 4, "eager", True) - 132.1) < 1.0      # the kit's 4-step engine time
    assert bench.prior_s(bench.Job(1280, 720, 81, "1"), 4, "eager", True) < 0.55 * bench.prior_s(big, 4, "eager", True)
    small = bench.Job(832, 480, 81, "default")
    assert bench.prior_s(small, 4, "eager", True) < 0.35 * bench.prior_s(big, 4, "eager", True)
    compile_extra = bench.prior_s(small, 4, "compile", True) - bench.prior_s(small, 4, "compile", False)
    assert abs(compile_extra - bench.PRIOR_COMPILE_FIRST_S) < 1e-9


def test_expected_time_follows_the_measured_jobs_and_gates_the_start():
    job = bench.Job(1280, 720, 81, "default")
    prior = bench.prior_s(job, 4, "eager", True)
    done = [{"wall_s": 20.0, "prior_s": 10.0}, {"wall_s": 30.0, "prior_s": 10.0}, {"skipped": "x"}]
    assert bench.expected_s(job, 4, "eager", True, done) == prior * 3.0      # median ratio of two = the upper one
    assert bench.expected_s(job, 4, "eager", True, []) == prior
    compiling = [{"wall_s": 1.0, "prior_s": 100.0, "first_of_shape": True}, {"wall_s": 20.0, "prior_s": 10.0}]
    assert bench.expected_s(job, 4, "compile", False, compiling) == bench.prior_s(job, 4, "compile", False) * 2.0
    assert bench.expected_s(job, 4, "eager", False, compiling[:1]) == prior * 0.01
    assert bench.fits(100.0, 100.0 * bench.JOB_MARGIN + bench.STOP_RESERVE_S, first=False)
    assert not bench.fits(100.0, 100.0 * bench.JOB_MARGIN + bench.STOP_RESERVE_S - 1, first=False)
    # a server's first job runs whenever a minute is left: its timeout bounds it, its log keeps s/step
    assert bench.fits(1000.0, bench.STOP_RESERVE_S + 60.0, first=True)
    assert not bench.fits(1.0, bench.STOP_RESERVE_S + 59.0, first=True)


def test_job_row_splits_the_wall_time_into_server_and_ours():
    progress = SimpleNamespace(seconds_per_step=9.5, done=True, started_at=100.0, updated_at=138.0)
    row = bench.job_row(bench.Job(832, 480, 81, "1"), TIMINGS, progress, 4)
    assert row["wall_s"] == 40.5 and row["inference_time_s"] == 40.0 and row["overhead_s"] == 0.5
    assert row["detect_s"] == 0.19 and row["download_s"] == 0.1 and row["decode_s"] == 0.2
    assert row["denoise_s_from_log"] == 38.0 and row["not_denoise_s"] == 2.0 and row["cfg"] is False
    bare = bench.job_row(bench.Job(832, 480, 81, "1"), {k: v for k, v in TIMINGS.items() if k != "server_inference"},
                         None, 4)
    assert bare["overhead_s"] is None and bare["seconds_per_step"] is None and bare["denoise_s_from_log"] is None


def _report(mode: str, ready: float, first: float, repeat: float, step: float) -> dict:
    job = {"shape": "832x480x81", "guidance": "default", "cfg": True, "seconds_per_step": step,
           "inference_time_s": repeat - 0.5, "overhead_s": 0.5, "nvml_peak_gib": 80.0, "planner_peak_gib": 84.0,
           "planner_error_pct": 5.0, "not_denoise_s": 3.0}
    jobs = [dict(job, wall_s=first), dict(job, wall_s=repeat, repeat_of_first=True),
            {"shape": "1280x720x81", "guidance": "default", "skipped": "expected 150 s, 90 s left"},
            {"shape": "1280x720x81", "guidance": "1", "error": "LauncherError: timed out |\n after 80 s",
             "progress_at_error": {"step": 2, "total": 4, "seconds_per_step": 16.25}}]
    report = {"mode": mode, "ready_s": ready, "jobs": jobs, "flags": ["--enforce-eager"] if mode == "eager" else [],
              "command": f"gpu_a14b.py --mode {mode}", "steps": 4,
              "server_versions": {"vllm": "0.26.0", "vllm_omni": "0.26.0"}, "model_build": {"expert_params_b": 14.29}}
    report["summary"] = bench.summarize(jobs)
    return report


def test_summary_takes_the_first_job_extra_from_its_repeat():
    summary = _report("compile", 250.0, 140.0, 40.0, 9.0)["summary"]
    assert summary["first_job_extra_s"] == 100.0
    assert summary["by_request"] == [{"shape": "832x480x81", "guidance": "default", "cfg": True, "wall_s": 40.0,
                                      "inference_time_s": 39.5, "overhead_s": 0.5, "seconds_per_step": 9.0,
                                      "nvml_peak_gib": 80.0, "planner_peak_gib": 84.0, "planner_error_pct": 5.0}]


def test_summary_without_a_measured_first_job_has_no_extra():
    jobs = _report("eager", 90.0, 42.0, 41.0, 10.0)["jobs"]
    del jobs[0]["wall_s"]
    assert bench.summarize(jobs)["first_job_extra_s"] is None


def test_break_even_weighs_compile_fixed_cost_against_its_step_gain():
    eager, compiled = _report("eager", 90.0, 42.0, 41.0, 10.0), _report("compile", 250.0, 140.0, 37.0, 9.0)
    be = table.break_even(eager, compiled)
    assert be["ready_extra_s"] == 160.0 and be["fixed_cost_s"] == 160.0 + 103.0 - 1.0
    assert be["gain_per_step_s"] == 1.0 and be["break_even_steps"] == 262
    slower = table.break_even(eager, _report("compile", 250.0, 140.0, 45.0, 10.5))
    assert slower["break_even_steps"] is None


def test_readme_comes_from_the_reports(tmp_path):
    for mode, args in (("eager", (90.0, 42.0, 41.0, 10.0)), ("compile", (250.0, 140.0, 37.0, 9.0))):
        (tmp_path / f"{mode}.json").write_text(json.dumps(_report(mode, *args)))
    sys.argv = ["gpu_a14b_table.py", str(tmp_path)]
    assert table.main() == 0
    text = (tmp_path / "README.md").read_text()
    assert "| eager | 90.0 s | `--enforce-eager` | 1.0 s |" in text
    assert "| compile | 832x480x81, guidance default (repeat) | 9.00 | 36.5 s | 37.0 s | 0.500 s | 3.0 s | 80.00 GiB | " \
           "84.00 GiB (+5.0%) |" in text
    assert "| eager | 1280x720x81, guidance default | expected 150 s, 90 s left |" in text
    assert "| eager | 1280x720x81, guidance 1 | LauncherError: timed out / after 80 s (the log had step 2/4, " \
           "16.25 s/step) |" in text
    assert "pays back after about 262 steps" in text and "2 x 14.29 B experts" in text


def test_break_even_needs_both_first_job_extras():
    eager, compiled = _report("eager", 90.0, 42.0, 41.0, 10.0), _report("compile", 250.0, 140.0, 37.0, 9.0)
    compiled["summary"]["first_job_extra_s"] = None        # the compiled server ran no repeat
    assert table.break_even(eager, compiled) == {"ready_extra_s": 160.0}
    assert "ready 160.0 s later; no request ran (and repeated) on both servers." in \
        table.render({"eager": eager, "compile": compiled})


def test_builder_shares_files_and_counts_them_once(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "model.safetensors").write_bytes(b"x" * 1000)
    (src / "config.json").write_text(json.dumps({"vocab_size": 5, "d_model": 8, "d_kv": 2, "d_ff": 16,
                                                 "num_layers": 1, "num_heads": 4}))
    folder = tmp_path / "model"
    linked = builder.link_tree(src, folder / "text_encoder")
    assert linked == 1000 + (src / "config.json").stat().st_size
    assert (folder / "text_encoder" / "model.safetensors").stat().st_ino == (src / "model.safetensors").stat().st_ino
    (folder / "copy.bin").write_bytes(b"y" * 10)
    assert builder.disk_bytes(folder) == linked + 10
    wanted = json.loads((src / "config.json").read_text())
    assert builder.encoder_matches(src, wanted)
    assert not builder.encoder_matches(src, dict(wanted, d_model=4096))
    assert not builder.encoder_matches(tmp_path / "missing", wanted)
