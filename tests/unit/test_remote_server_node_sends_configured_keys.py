"""Remote Server's keys: the node offers the servers configured in remote_servers and sends a
configured server's API key, a typed URL gets the key only when its origin is configured, and a
bad name or URL names its widget (a recording HTTP server of our own on 127.0.0.1).
"""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from comfy_standin import ComfyStandIn, run_node
from vllm_omni_launcher.errors import LauncherError
from vllm_omni_launcher.nodes import NODES
from vllm_omni_launcher.server.config.remote_servers import USE_URL


class _RecordingServer:
    """A vLLM-Omni look-alike that wants key 'k' and records every Authorization header."""

    def __init__(self) -> None:
        self.auth: list[str | None] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                owner.auth.append(self.headers.get("Authorization"))
                if self.headers.get("Authorization") == "Bearer k":
                    code, body = 200, {"data": [{"id": "Wan-AI/Wan2.2-TI2V-5B-Diffusers"}]}
                else:
                    code, body = 401, {"error": {"message": "Unauthorized", "code": 401}}
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def recording(tmp_path, monkeypatch):
    server = _RecordingServer()
    config = tmp_path / "launcher.json"
    config.write_text(json.dumps({"remote_servers": {
        "box": {"url": f"http://127.0.0.1:{server.port}", "api_key": "k"}}}))
    monkeypatch.setenv("VLLM_OMNI_LAUNCHER_CONFIG", str(config))
    yield server
    server.close()


def test_remote_server_offers_configured_servers_and_sends_their_key(recording):
    remote_server = NODES["VLLMOmniRemoteServer"].inputs()[-1]
    assert remote_server.name == "remote_server" and remote_server.choices() == [USE_URL, "box"]
    with ComfyStandIn() as comfy:
        handle = run_node("VLLMOmniRemoteServer", "http://ignored.invalid", "ti2v_5b", "box", unique_id="2")[0]
    assert recording.auth == ["Bearer k"]
    assert (handle.url, handle.remote_name, handle.served_name) == (
        f"http://127.0.0.1:{recording.port}", "box", "Wan-AI/Wan2.2-TI2V-5B-Diffusers")
    assert "k" not in repr(handle).replace("kind", "") and "api_key" not in repr(handle)
    assert comfy.texts[0] == ("Connecting", "2") and comfy.texts[-1][0].startswith("Connected: ")


def test_a_typed_url_gets_the_key_only_when_its_origin_is_configured(recording):
    run_node("VLLMOmniRemoteServer", f"http://127.0.0.1:{recording.port}/v1", "ti2v_5b")       # the configured origin (path ignored)
    assert recording.auth == ["Bearer k"]
    with pytest.raises(LauncherError) as err:                              # same server, another origin
        run_node("VLLMOmniRemoteServer", f"http://localhost:{recording.port}", "ti2v_5b")
    assert recording.auth[1:] and all(a is None for a in recording.auth[1:]), "the key went to an unnamed origin"
    assert "requires an API key" in err.value.what


def test_an_unknown_configured_name_and_a_bad_url_name_the_widget(recording):
    with pytest.raises(LauncherError) as err:
        run_node("VLLMOmniRemoteServer", "http://127.0.0.1:1", "ti2v_5b", "gpu-box")
    assert err.value.setting == "remote_server" and "remote_servers" in err.value.fix
    with pytest.raises(LauncherError) as err:
        run_node("VLLMOmniRemoteServer", "ftp://127.0.0.1:1", "ti2v_5b")
    assert err.value.setting == "url"
    assert recording.auth == []
