"""Remote Server's model_family must agree with the model the server lists first: a TI2V-5B server
connected as t2v_a14b would get A14B's defaults (832x480x81 at 16 fps, its guidance and shift) with
no word. A served id no family claims (a renamed model, a folder on the server's machine, a hostile
name) leaves the widget's family as given, as before."""
from __future__ import annotations

import hostile_server as hs
import pytest

from vllm_omni_launcher.errors import LauncherError
from vllm_omni_launcher.nodes import NODES, session
from vllm_omni_launcher.server.config.remote_servers import USE_URL

TI2V = "Wan-AI/Wan2.2-TI2V-5B-Diffusers"


def _serving(hostile, served: str) -> hs.HostileServer:
    return hostile({("GET", "/v1/models"): hs.answer(200, {"object": "list", "data": [{"id": served}]})})


def test_a_family_the_served_model_contradicts_is_refused_naming_the_widget_value_to_set(hostile):
    server = _serving(hostile, TI2V)
    with pytest.raises(LauncherError) as caught:
        session.connect_remote(server.url, "t2v_a14b", USE_URL, None)
    err = caught.value
    assert err.setting == "model_family"
    assert err.what == (f"The server at {server.url} serves {TI2V} (Wan2.2 TI2V-5B), but Remote Server's "
                        "model_family says t2v_a14b (Wan2.2 T2V-A14B)")
    assert "request defaults" in err.why and "request rules" in err.why
    assert err.fix == "set Remote Server's model_family to ti2v_5b"
    options = next(i for i in NODES["VLLMOmniRemoteServer"].inputs() if i.name == "model_family").options
    assert "ti2v_5b" in options and "auto" not in options       # the fix names a value the widget offers


def test_the_family_the_server_serves_connects(hostile):
    server = _serving(hostile, TI2V)
    handle = session.connect_remote(server.url, "ti2v_5b", USE_URL, None)
    assert (handle.served_name, handle.family.key) == (TI2V, "ti2v_5b")


@pytest.mark.parametrize("served", ["my-wan", "/models/on/the/server", "~nobody/wan", "w" * 5000])
def test_a_served_id_no_family_claims_keeps_the_widgets_family(hostile, served):
    server = _serving(hostile, served)
    handle = session.connect_remote(server.url, "t2v_a14b", USE_URL, None)
    assert handle.family.key == "t2v_a14b"          # (the client cuts a long id: served_name is its copy)
