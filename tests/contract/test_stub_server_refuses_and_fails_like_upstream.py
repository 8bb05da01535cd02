"""The stub vLLM-Omni server (stub_vllm_serve.py) refuses and fails like ``vllm serve MODEL --omni``.

Argparse and device-count refusals, and the start-time fault knobs (OOM at load, OOM in job,
crash and hang after N jobs, load delay, step pace, jobs file), each checked on the record of
a scenario that starts its own stub (see stub_server_scenarios.py).
"""
from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from stub_server_scenarios import OOM_TEXT, outcome, run_needed_scenarios, uses  # noqa: E402


@pytest.fixture(scope="module")
def runs(request, stub_pool) -> dict:
    """The records of the scenarios this module's selected tests use (started when it starts)."""
    return run_needed_scenarios(request, stub_pool)


@uses("fake_flag")
def test_blog_flag_is_an_argparse_error(runs):
    obs = outcome(runs, "fake_flag")
    assert obs["rc"] == 2
    assert "vllm: error: unrecognized arguments: --model-type wan2_2" in obs["log"]


@uses("too_few_devices")
def test_world_size_above_visible_devices_is_refused(runs):
    obs = outcome(runs, "too_few_devices")
    assert obs["rc"] != 0
    assert "Stage 0 requires 4 device(s) based on parallel_config, but 2 device(s) are available" in obs["log"]
    assert "Traceback (most recent call last):" in obs["log"]
    assert "Application startup complete." not in obs["log"]


@uses("oom_unless_flag_missing")
def test_oom_at_load_fails_stage_init(runs):
    obs = outcome(runs, "oom_unless_flag_missing")
    assert obs["rc"] != 0
    assert OOM_TEXT in obs["log"]
    assert "RuntimeError: Orchestrator initialization failed: CUDA out of memory." in obs["log"]
    assert "Application startup complete." not in obs["log"]


@uses("oom_unless_flag_missing")
def test_oom_unless_ooms_without_the_flag(runs):
    obs = outcome(runs, "oom_unless_flag_missing")
    assert obs["rc"] != 0 and OOM_TEXT in obs["log"]


@uses("oom_in_job_then_crash")
def test_oom_in_job_fails_that_job_and_the_server_stays_up(runs):
    obs = outcome(runs, "oom_in_job_then_crash")
    job1 = obs["job1"]
    assert job1.status_code == 500 and job1.json()["status"] == "failed"
    assert job1.json()["error"]["code"] == 500
    assert job1.json()["error"]["message"].startswith("CUDA out of memory. Tried to allocate 2.00 GiB.")
    assert obs["health_after_oom"] == 200
    assert obs["job2"].json()["status"] == "completed"


@uses("oom_in_job_then_crash")
def test_jobs_file_gets_one_line_per_job_request_with_its_status(runs):
    obs = outcome(runs, "oom_in_job_then_crash")
    assert obs["refused"] == 400
    assert obs["jobs_file"] == ["POST /v1/videos 400", "POST /v1/videos 200", "POST /v1/videos 200"]


@uses("oom_in_job_then_crash")
def test_crash_after_jobs_kills_the_process(runs):
    obs = outcome(runs, "oom_in_job_then_crash")
    assert obs["rc"] != 0
    assert "EngineDeadError" in obs["log"]
    assert "died unexpectedly" in obs["log"]
    assert obs["group_left"] == []


@uses("load_delay_then_hang")
def test_port_refuses_connections_while_loading(runs):
    obs = outcome(runs, "load_delay_then_hang")
    assert obs["during_load"] == "refused" and obs["loaded_when_probed"] is False
    assert obs["health"] == 200


@uses("load_delay_then_hang")
def test_step_knob_paces_the_progress(runs):
    log = outcome(runs, "load_delay_then_hang")["log"]
    for step in (1, 2, 3, 4):  # each step is printed on its own (steps are longer than tqdm's refresh)
        assert f"| {step}/4 [" in log


@uses("load_delay_then_hang")
def test_hang_after_jobs_stops_answering_but_stays_alive(runs):
    obs = outcome(runs, "load_delay_then_hang")
    assert obs["job"].json()["status"] == "completed"
    assert obs["hung"] is True and obs["alive_while_hung"] is True
