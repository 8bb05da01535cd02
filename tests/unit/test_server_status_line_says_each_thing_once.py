"""Server Status's line names the model, GPUs and URL once, then the phase: a ready server's own
text (written for the launching node) restates them, so only its note is kept, whole (`Status.note`,
set on the supervisor's status board beside the text). The whole line, with the log path, is checked on
the stub server in tests/contract/test_nodes_stub.py."""
from __future__ import annotations

import threading
from typing import Optional

from vllm_omni_launcher.nodes.session import _state
from vllm_omni_launcher.server.registry import HeadRole, Status
from vllm_omni_launcher.server.supervision.status import StatusBoard

URL = "http://127.0.0.1:44775"
# a real drain decision's wording (cancel_policy.py): the note itself holds "; "
DRAIN = ("Letting the cancelled job drain: GPU free in ~12 s (step 15/20 at 2.00 s/step); a restart would take "
         "~40 s (its last start), so the server keeps running")


def _status(text: str, ready: bool = True, note: Optional[str] = None, **more) -> Status:
    """The status a supervisor publishes after its board was set to `text` with `note`."""
    board = StatusBoard(threading.RLock(), lambda: None)  # type: ignore[arg-type,return-value] - no listener
    board.set("ready" if ready else "loading", text, note=note)
    return Status(ready=ready, pid=1, port=44775, url=URL, generation=1, fingerprint="f",
                  **{**board.fields(), **more})


def test_a_ready_server_is_ready_and_keeps_only_its_notes():
    assert _state(_status(f"Ready: Wan-AI/Wan2.2-TI2V-5B-Diffusers at {URL} (GPUs 0,1)")) == "Ready"
    head = _status(f"Ready: m at {URL} (GPUs 0,1)", note=HeadRole("0.0.0.0", 9000, 900.0).ready_note)
    assert head.text == f"Ready: m at {URL} (GPUs 0,1); accepting replicas on 0.0.0.0:9000"
    assert _state(head) == "Ready; accepting replicas on 0.0.0.0:9000"
    assert _state(_status(f"Ready at {URL}", note="the cancelled job's denoise ended, the GPU is free")) == \
        "Ready; the cancelled job's denoise ended, the GPU is free"


def test_a_note_holding_a_semicolon_reaches_the_line_whole():
    status = _status(f"Ready at {URL}", note=DRAIN)
    assert status.text == f"Ready at {URL}; {DRAIN}"          # the server's own text, as before
    assert _state(status) == f"Ready; {DRAIN}"


def test_a_restarted_server_says_how_often_and_why():
    text = f"Restarted after a crash. Ready at {URL} (generation 2)"
    assert _state(_status(text, restarts=1, restart_reason="The server crashed (crash)")) == \
        "Ready (restarted 1x, the last time because: The server crashed (crash))"


def test_a_semicolon_in_the_servers_own_words_is_not_taken_for_a_note():
    """A restart's text quotes the failure, which may hold "; ": none of it is a note."""
    text = f"Restarted after: the engine core died; exit code 1. Ready at {URL} (generation 2)"
    assert _state(_status(text, restarts=1, restart_reason="The engine core died (crash)")) == \
        "Ready (restarted 1x, the last time because: The engine core died (crash))"


def test_a_server_not_ready_shows_its_own_text():
    assert _state(_status("Multi-thread loading shards: 1/2", ready=False)) == "Multi-thread loading shards: 1/2"
