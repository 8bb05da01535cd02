"""The server's stored-MP4 line reaches the client through the Supervisor, against the stub (the real
vLLM-Omni 0.30 API layer stores the MP4 and logs the line itself; fake GPU).

A job sent the CLI's way (cli/generate_cmd._denoised: the hint a supervised server gives, the node's too)
with a 60 s poll interval: after its first poll the client is asleep for a minute unless a hint opens a
window. The hint is narrowed to its STORED level, so only the stored line can wake it: the job is seen
done long before the next normal poll, and the client says the stored hint came before it saw the job done.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Iterator

import pytest

import stubserver

from vllm_omni_launcher.cli import generate_cmd
from vllm_omni_launcher.client.api import GenerationCancelled, VideoClient, VideoRequest
from vllm_omni_launcher.client.poll_window import Hint
from vllm_omni_launcher.server.config.local_config import LocalConfig
from vllm_omni_launcher.server.launch.spec import LaunchSpec
from vllm_omni_launcher.server.supervision.supervisor import Supervisor

TI2V = "Wan-AI/Wan2.2-TI2V-5B-Diffusers"
START_S = 420.0
POLL_S = 60.0            # the client's normal interval: no normal poll comes while the job runs
GIVE_UP_S = 120.0        # a client that never wakes is cancelled here, and the test fails saying so


@pytest.fixture
def sup(tmp_path: Path) -> Iterator[Supervisor]:
    config = LocalConfig(server_command=(stubserver.server_python(), str(stubserver.STUB_SCRIPT)),
                         data_dir=str(tmp_path / "data"), startup_timeout_s=START_S,
                         extra_env={"VLLM_OMNI_STUB_STEP_S": "0.1"})   # 8 steps: the first poll sees it running
    supervisor = Supervisor(LaunchSpec(model=TI2V, gpus=(0,)), config)
    supervisor.start()
    try:
        yield supervisor
    finally:
        supervisor.stop()


def test_the_stored_line_wakes_a_client_that_would_sleep_a_minute(sup: Supervisor) -> None:
    due = generate_cmd._denoised(sup)
    assert due is not None
    seen: list[Hint] = []

    def stored_only() -> Hint:
        level = Hint(due())
        seen.append(level)
        return level if level == Hint.STORED else Hint.NONE

    give_up = time.monotonic() + GIVE_UP_S
    request = VideoRequest("a red fox in snow", width=256, height=128, num_frames=9, fps=16, steps=8, seed=3)
    with VideoClient(sup.url, api_key=sup.api_key, served_name=sup.spec.served_name) as client:
        try:
            result = client.generate(request, poll_interval=POLL_S, due=stored_only, decode=False,
                                     should_cancel=lambda: time.monotonic() > give_up)
        except GenerationCancelled:
            pytest.fail(f"the stored line never woke the client within {GIVE_UP_S:g} s; hints seen: {set(seen)}")
    log = Path(sup.log_path).read_text(errors="replace")
    assert f"Video request {result.job_id} persisted " in log     # upstream's own line, for this job
    assert "stored_hint" in result.timings                 # the stored hint came, then the poll that saw it done
    assert seen == sorted(seen) and seen[-1] == Hint.STORED, set(seen)   # through the log, in order
    assert sup.progress().stored and due() == Hint.STORED
