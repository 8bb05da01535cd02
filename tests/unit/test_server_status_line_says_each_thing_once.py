"""Server Status's line names the model, GPUs and URL once, then the phase: a ready server's own
text (written for the launching node) restates them, so only its notes are kept. The whole line,
with the log path, is checked on the stub server in tests/contract/test_nodes_stub.py."""
from __future__ import annotations

from vllm_omni_launcher.nodes.session import _state
from vllm_omni_launcher.server.registry import Status

URL = "http://127.0.0.1:44775"


def _status(text: str, ready: bool = True, **more) -> Status:
    return Status(phase="ready" if ready else "loading", text=text, ready=ready, pid=1, port=44775, url=URL,
                  generation=1, fingerprint="f", **more)


def test_a_ready_server_is_ready_and_keeps_only_its_notes():
    assert _state(_status(f"Ready: Wan-AI/Wan2.2-TI2V-5B-Diffusers at {URL} (GPUs 0,1)")) == "Ready"
    assert _state(_status(f"Ready: m at {URL} (GPUs 0,1); accepting replicas on 0.0.0.0:9000")) == \
        "Ready; accepting replicas on 0.0.0.0:9000"
    assert _state(_status(f"Ready at {URL}; the cancelled job's denoise ended, the GPU is free")) == \
        "Ready; the cancelled job's denoise ended, the GPU is free"


def test_a_restarted_server_says_how_often_and_why():
    text = f"Restarted after a crash. Ready at {URL} (generation 2)"
    assert _state(_status(text, restarts=1, restart_reason="The server crashed (crash)")) == \
        "Ready (restarted 1x, the last time because: The server crashed (crash))"


def test_a_server_not_ready_shows_its_own_text():
    assert _state(_status("Multi-thread loading shards: 1/2", ready=False)) == "Multi-thread loading shards: 1/2"
