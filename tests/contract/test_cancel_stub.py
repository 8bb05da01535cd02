"""Cancel that weighs its cost, against the stub (real vLLM-Omni 0.30 HTTP layer, fake GPU).

The stub, like upstream, keeps denoising a running job after its DELETE. With five seconds per
step (VLLM_OMNI_STUB_STEP_S), a job with a few steps left drains (a restart costs this
server's measured start, tens of seconds), and one with hundreds left gets the server
restarted (at most 200 steps, upstream's limit). One stub start serves both sides of the break-even; the grace is 2 s here.
The restart is checked up to the new process's start (its readiness is test_supervisor_faults.py's).
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Iterator

import pytest

import stubserver
from stubserver import wait_for
from processes import alive

from vllm_omni_launcher.client.api import VideoClient, VideoRequest
from vllm_omni_launcher.server.supervision.cancel_policy import DRAIN, RESTART, CancelPolicy
from vllm_omni_launcher.server.config.local_config import LocalConfig
from vllm_omni_launcher.server.launch.spec import LaunchSpec
from vllm_omni_launcher.server.supervision.supervisor import Supervisor

TI2V = "Wan-AI/Wan2.2-TI2V-5B-Diffusers"
START_S = 420.0
STEP_S = 5.0
LOGGER = "vllm_omni_launcher.server.supervision.cancel_watch"


@pytest.fixture(scope="module")
def sup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Supervisor]:
    data_dir: Path = tmp_path_factory.mktemp("cancel")
    config = LocalConfig(server_command=(stubserver.server_python(), str(stubserver.STUB_SCRIPT)),
                         data_dir=str(data_dir), startup_timeout_s=START_S,
                         extra_env={"VLLM_OMNI_STUB_STEP_S": str(STEP_S)})
    supervisor = Supervisor(LaunchSpec(model=TI2V, gpus=(0,)), config, cancel_policy=CancelPolicy(grace_s=2.0))
    supervisor.start()
    try:
        yield supervisor
    finally:
        supervisor.stop()
    assert not supervisor.alive()


def start_and_cancel(sup: Supervisor, steps: int, seed: int) -> tuple[str, Any]:
    """Submit a job, let it denoise 2 steps, DELETE it, hand the cancel to the supervisor."""
    before = sup.progress()
    floor = before.run_id if before is not None else -1
    with VideoClient(sup.url, api_key=sup.api_key, served_name=sup.spec.served_name) as client:
        job = client.submit(VideoRequest("a red fox in snow", width=256, height=128, num_frames=9, fps=16,
                                         steps=steps, seed=seed))
        wait_for(lambda: (p := sup.progress()) is not None and p.run_id > floor and p.step >= 2, 120,
                 "the job to denoise two steps")
        assert client.delete(job)
    return job, sup.cancel_job(job, floor)


def test_a_cancel_with_little_denoise_left_lets_it_drain(sup: Supervisor, caplog: pytest.LogCaptureFixture) -> None:
    restart_s = sup.restart_time_s
    assert restart_s is not None and restart_s > 0          # measured at this server's start
    print(f"measured restart time: {restart_s:.1f} s")
    generation, pid = sup.generation, sup.status().pid
    with caplog.at_level(logging.INFO, logger=LOGGER):
        job, decision = start_and_cancel(sup, steps=4, seed=1)
    assert decision.action == DRAIN and decision.remaining_s is not None and decision.remaining_s <= 2 * STEP_S + 1
    assert decision.restart_s == restart_s and "drain" in decision.text and "GPU free in" in decision.text
    assert decision.text in sup.status().text
    assert any(job in r.getMessage() and decision.text in r.getMessage() for r in caplog.records)
    wait_for(lambda: (p := sup.progress()) is not None and p.done, 60, "the cancelled denoise to end")
    wait_for(lambda: "GPU is free" in sup.status().text, 10, "the status to say the GPU is free")
    status = sup.status()
    assert sup.generation == generation and status.pid == pid and status.ready


def test_a_cancel_with_more_denoise_left_than_a_restart_restarts(sup: Supervisor) -> None:
    generation, pid = sup.generation, sup.status().pid
    restart_s = sup.restart_time_s
    assert restart_s is not None and 198 * STEP_S > 2.0 + 1.2 * restart_s + 5.0, \
        f"this machine started the stub in {restart_s} s: 200 steps of {STEP_S} s cannot outlast a restart"
    job, decision = start_and_cancel(sup, steps=200, seed=2)
    assert decision.action == RESTART and decision.remaining_s is not None and decision.remaining_s > 900
    assert "Restarting the server in 2 s" in decision.text
    wait_for(lambda: sup.generation == generation + 1, 60, "the restart to begin")
    # The decision and its effect: the busy process is gone and a new one is starting.  That
    # relaunch becoming ready is not waited for (a vLLM import of its own): the same hard-cancel
    # restart is proven ready by test_supervisor_faults.py::test_slow_load_progress_hard_cancel_and_crash_restart.
    wait_for(lambda: (p := sup.status().pid) is not None and p != pid, 60, "the new server process")
    assert not alive(pid)
    status = sup.status()
    assert job in status.restart_reason and "still running on the GPU" in status.restart_reason
    assert sup.progress().aborted
