"""Remote Server's model-list request obeys Cancel: pressed while a server that accepts and never
answers holds the request, the node ends as interrupted at once instead of waiting through every
first-byte deadline and retry (5 tries x 30 s by default); a server that answers still connects."""
from __future__ import annotations

import threading

import hostile_server as hs
import pytest

from vllm_omni_launcher.nodes import comfy_bridge, session
from vllm_omni_launcher.server.config.remote_servers import USE_URL


@pytest.fixture
def cancel(monkeypatch):
    """ComfyUI's Cancel flag, as an Event (comfy_bridge reads it without clearing it)."""
    pressed = threading.Event()
    monkeypatch.setattr(comfy_bridge, "interrupted", pressed.is_set)
    return pressed


@pytest.fixture
def silent(hostile, cancel):
    """A server that accepts GET /v1/models and never answers; the user presses Cancel once the
    request has arrived. Released at teardown so its handler thread ends."""
    hold = threading.Event()

    def route(peer: hs.Peer) -> None:
        cancel.set()
        hold.wait()

    server = hostile({("GET", "/v1/models"): route})
    yield server
    hold.set()


def test_cancel_while_the_server_never_answers_ends_the_node_after_one_try(silent, cancel):
    with pytest.raises(KeyboardInterrupt):        # comfy_bridge.raise_interrupted outside ComfyUI
        session.connect_remote(silent.url, "ti2v_5b", USE_URL, None)
    assert cancel.is_set()
    assert len(silent.calls("GET", "/v1/models")) == 1      # no retry after the cancel


def test_cancel_pressed_before_the_node_runs_sends_no_retry(hostile, cancel):
    hold = threading.Event()
    server = hostile({("GET", "/v1/models"): lambda peer: hold.wait()})
    cancel.set()
    try:
        with pytest.raises(KeyboardInterrupt):
            session.connect_remote(server.url, "ti2v_5b", USE_URL, None)
        assert len(server.calls("GET", "/v1/models")) <= 1
    finally:
        hold.set()


def test_a_server_that_answers_still_connects(hostile, cancel):
    server = hostile({("GET", "/v1/models"): hs.answer(200, {"object": "list", "data": [{"id": "served-m"}]})})
    handle = session.connect_remote(server.url + "/v1", "ti2v_5b", USE_URL, None)
    assert (handle.kind, handle.url, handle.served_name, handle.family.key) == ("remote", server.url, "served-m",
                                                                                "ti2v_5b")
    assert not cancel.is_set()
