"""Generate Video logs one INFO line per finished job to ComfyUI's console: frames, size, fps, the server's own
job time (`inference_time_s`, the client's `server_inference`) and when the frames were ready after submit (the
client's `decoded`), nothing else (no prompt, key or URL: logs hold nothing secret). The head-to-head bench
(bench/gpu/native.py) reads that line from ComfyUI's log, so the node's overhead is measured directly.
"""
from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any, Optional

import numpy as np
import pytest

from vllm_omni_launcher.client.frames import DecodedVideo
from vllm_omni_launcher.client.job_results import GenerationResult
from vllm_omni_launcher.nodes import session
from vllm_omni_launcher.nodes.handles import ServerHandle

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
try:
    from bench.gpu import native
finally:
    sys.path.remove(str(REPO))      # the repo root holds top-level names (server, nodes) ComfyUI also uses

URL, PROMPT = "http://10.0.0.7:8091", "a red fox in fresh snow"


class _Server:
    """The remote server's side of one job: it hands back a finished result with the timings it was given."""

    base_url = URL

    def __init__(self, timings: dict[str, float]) -> None:
        self.timings = timings

    def __enter__(self) -> "_Server":
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def generate(self, request: Any, **poll: Any) -> GenerationResult:
        frames = np.zeros((9, 16, 32, 3), dtype=np.float32)
        return GenerationResult("job-1", b"mp4", DecodedVideo(frames, 24.0), dict(self.timings))


@pytest.mark.parametrize("server, said", [
    (13.2734, "the server's own time 13.273 s"),
    (None, "the server gave no time"),           # a server whose job status has no inference_time_s
])
def test_a_finished_job_logs_its_frames_and_the_servers_and_clients_times(monkeypatch, caplog, server: Optional[float],
                                                                          said: str):
    timings = {"submit": 0.01, "decoded": 13.4991, **({} if server is None else {"server_inference": server})}
    monkeypatch.setattr(session, "job_client", lambda handle, reporter, cfg, jobs: (_Server(timings), None))
    handle = ServerHandle("remote", URL, "Wan-AI/Wan2.2-TI2V-5B-Diffusers", "ti2v_5b")
    with caplog.at_level(logging.INFO, logger=session.__name__):
        session.generate_video(handle, prompt=PROMPT, seed=7)
    lines = [r.getMessage() for r in caplog.records if r.name == session.__name__]
    assert lines == [f"vLLM-Omni job done: 9 frames 32x16 at 24 fps; {said}, frames ready 13.499 s after submit"]
    assert all(r.levelno == logging.INFO for r in caplog.records if r.name == session.__name__)
    assert not any(secret in lines[0] for secret in (URL, "10.0.0.7", PROMPT, "fox"))
    # what the bench reads back from ComfyUI's log
    assert native.job_done_times(f"noise\n{lines[0]}\nPrompt executed in 14.1 seconds\n") == [
        {"server_inference_s": None if server is None else 13.273, "frames_ready_s": 13.499}]
