"""The stub vLLM-Omni server (stub_vllm_serve.py) serves like ``vllm serve MODEL --omni``: on the shared stubs.

Start lines, routes and API key, job round trips, size and frame rules of the Wan pipelines,
I2V/TI2V, progress output, SIGTERM, and the per-request fault knobs (``extra_params``) and the
hang knob, each checked on the record of a scenario run on one of the session's shared stubs
(see stub_server_scenarios.py: a pooled scenario runs once, so all its tests live here).
"""
from __future__ import annotations

import os
import re
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from shared_stubs import I2V, T2V, TI2V  # noqa: E402
from stub_server_scenarios import outcome, run_needed_scenarios, uses  # noqa: E402


@pytest.fixture(scope="module")
def runs(request, stub_pool) -> dict:
    """The records of the scenarios this module's selected tests use (started when it starts)."""
    return run_needed_scenarios(request, stub_pool)


@pytest.mark.parametrize("scenario_name,model", [("t2v", T2V), ("i2v", I2V), ("ti2v_with_offload", TI2V)])
def test_starts_healthy_and_lists_the_hf_id(runs, scenario_name, model):
    obs = outcome(runs, scenario_name)
    assert obs["health"] == 200
    assert [m["id"] for m in obs["models"]["data"]] == [model]
    assert f"Detected diffusion model: {model}" in obs["log"]


@uses("t2v")
def test_startup_prints_the_real_phase_lines_in_order(runs):
    log = outcome(runs, "t2v")["log"]
    phases = ["Delegating entrypoint handling to vllm-omni", f"Detected diffusion model: {T2V}",
              "Detected pipeline 'wan2_2_ti2v' from model_index.json (_class_name='WanPipeline')",
              "Prefetching", "Multi-thread loading shards", "Loading weights took", "Model loading took",
              "Model runner: Model loaded successfully.", "dummy run to warm up the model",
              "Detected pure diffusion mode (single diffusion stage)",
              "Starting vLLM API server (pure diffusion mode) on http://127.0.0.1:",
              "Available routes are:", "Application startup complete."]
    positions = [log.find(p) for p in phases]
    assert -1 not in positions, dict(zip(phases, positions))
    assert positions == sorted(positions)
    assert re.search(r"Model loading took \d+\.\d{4} GiB and \d+\.\d{6} seconds", log)


@uses("t2v")
def test_writes_stub_pid_first(runs):
    obs = outcome(runs, "t2v")
    assert obs["stub_pid"] == obs["pid"]
    assert obs["log"].startswith(f"STUB_PID={obs['pid']}\n")


@uses("t2v")
def test_v1_routes_need_the_api_key_but_health_does_not(runs):
    obs = outcome(runs, "t2v")
    assert obs["health_no_key"] == 200
    assert obs["models_no_key"] == (401, {"error": "Unauthorized"})
    assert obs["videos_no_key"] == 401


@uses("t2v")
def test_job_round_trip_frames_carry_index_and_seed(runs):
    status, job, video = outcome(runs, "t2v")["roundtrip"]
    assert status == 200 and job["status"] == "completed" and job["progress"] == 100
    assert (job["num_frames"], job["fps"], job["model"]) == (5, 8.0, T2V)
    assert (video["codec"], video["pix_fmt"], video["fps"]) == ("h264", "yuv420p", 8.0)
    assert video["shapes"] == {(64, 64, 3)}
    assert video["codes"] == [(i, 1234 % 256) for i in range(5)]


@uses("t2v")
def test_a14b_floors_size_to_16_and_frames_to_4k_plus_1(runs):
    job, video = outcome(runs, "t2v")["floored"]
    assert job["num_frames"] == 5
    assert video["shapes"] == {(32, 64, 3)}
    assert video["codes"] == [(i, 77) for i in range(5)]


@uses("t2v")
def test_sync_endpoint_returns_the_mp4(runs):
    status, content_type, video = outcome(runs, "t2v")["sync"]
    assert (status, content_type) == (200, "video/mp4")
    assert video["codes"] == [(i, 9) for i in range(9)]


@uses("t2v")
def test_delete_drops_the_job_but_the_denoise_runs_to_its_end(runs):
    obs = outcome(runs, "t2v")
    status, body, get_after, finished_before = obs["delete"]
    assert status == 200 and body["deleted"] is True and get_after == 404
    assert not finished_before
    assert "60/60" in obs["after_delete_log"]  # progress kept coming after the DELETE


@uses("t2v")
def test_sigterm_exits_cleanly_with_its_process_group(runs):
    obs = outcome(runs, "t2v")
    assert obs["sigterm_rc"] == 0
    assert obs["group_left"] == []
    assert "Application shutdown complete." in obs["log"]


@uses("t2v")
def test_denoise_progress_is_real_tqdm(runs):
    log = outcome(runs, "t2v")["log"]
    assert re.search(r"\r  0%\|          \| 0/2 \[00:00<\?, \?it/s\]", log)
    assert re.search(r"\r100%\|██████████\| 2/2 \[\d\d:\d\d<\d\d:\d\d, +\d+\.\d+it/s\]", log)


@uses("i2v")
def test_progress_goes_to_stderr_and_log_lines_to_stdout(runs):
    obs = outcome(runs, "i2v")
    assert "| 2/2 [" in obs["own_stderr"] and "| 2/2 [" not in obs["stdout"]
    assert obs["stderr"].startswith("STUB_PID=")
    assert "Model loading took" in obs["stdout"] and "Starting vLLM API server" in obs["stdout"]


@uses("i2v")
def test_i2v_without_image_fails_with_the_real_message(runs):
    job = outcome(runs, "i2v")["no_image"]
    body = job.json()
    assert job.status_code == 500 and body["status"] == "failed" and body["error"]["code"] == 500
    assert "No image is provided. This model requires an image to run." in body["error"]["message"]


@uses("i2v")
def test_i2v_size_not_multiple_of_16_fails_the_job(runs):
    job = outcome(runs, "i2v")["bad_size"]
    assert job.status_code == 500 and job.json()["status"] == "failed"
    assert job.json()["error"]["message"] == "`height` and `width` have to be divisible by 16 but are 64 and 72."


@uses("i2v")
def test_i2v_with_image_renders(runs):
    job, video = outcome(runs, "i2v")["good"]
    assert job["status"] == "completed" and job["num_frames"] == 9
    assert video["shapes"] == {(48, 64, 3)}
    assert video["codes"] == [(i, 5) for i in range(9)]


@uses("ti2v_with_offload")
def test_ti2v_floors_size_to_32(runs):
    job, video = outcome(runs, "ti2v_with_offload")["floored"]
    assert job["num_frames"] == 9
    assert video["shapes"] == {(64, 64, 3)}
    assert video["codes"] == [(i, 300 % 256) for i in range(9)]


@uses("ti2v_with_offload")
def test_omitted_seed_gives_one_random_seed_per_job(runs):
    job, video = outcome(runs, "ti2v_with_offload")["no_seed"]
    assert job["status"] == "completed"
    assert [c[0] for c in video["codes"]] == list(range(5))
    assert len({c[1] for c in video["codes"]}) == 1


@uses("ti2v_with_offload")
def test_oom_unless_starts_with_the_flag(runs):
    obs = outcome(runs, "ti2v_with_offload")
    assert obs["health"] == 200 and "OutOfMemoryError" not in obs["startup_log"]


@uses("ti2v_with_offload")
def test_stub_oom_extra_param_fails_that_job_and_the_next_one_renders(runs):
    obs = outcome(runs, "ti2v_with_offload")
    job = obs["oom_knob"]
    assert job.status_code == 500 and job.json()["status"] == "failed"
    assert job.json()["error"]["message"].startswith("CUDA out of memory. Tried to allocate 2.00 GiB.")
    assert obs["no_seed"][0]["status"] == "completed"


@uses("t2v")
def test_hang_in_job_stalls_until_deleted_and_the_gpu_stays_busy(runs):
    obs = outcome(runs, "t2v")["hang_in_job"]
    assert obs["stalled_status"] == "in_progress"
    assert "1/5 [" in obs["stalled_log"] and "5/5 [" not in obs["stalled_log"]
    assert obs["delete"] == (200, 404)
    assert obs["second_status"] == "queued"  # the stalled denoise still holds the engine
    assert obs["health_during_hang"] == 200 and obs["alive"]
    assert "5/5 [" not in obs["log"]
