"""Nothing rides along with our requests: no ~/.netrc credentials, no proxy from the environment.

`requests` by default sends a `default` ~/.netrc entry as Basic auth to any host (replacing a
configured Bearer key) and routes through HTTP(S)_PROXY / ALL_PROXY. The one HTTP layer
(client/transport.py) trusts nothing from the environment; the only proxy is the local config's
`remote_proxy`, for remote servers only. Here the environment is hostile: a fake HOME whose
.netrc has a `default` entry, and every proxy variable pointing at a listener that records any
connection. The servers (and proxies: hostile_server.py records the absolute URL a proxy is asked for) are our
own peers on 127.0.0.1, reached under spellings of loopback that a literal check would not have
recognised.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from hostile_server import HostileServer, answer
from vllm_omni_launcher.client.api import VideoClient
from vllm_omni_launcher.client.hosts import is_loopback_host, numeric_ipv4
from vllm_omni_launcher.client.transport import Transport, env_proxy_note
from vllm_omni_launcher.errors import LauncherError
from vllm_omni_launcher.nodes import session
from vllm_omni_launcher.server.config.local_config import load_local_config, origin

KEY = "sk-configured-key-1234"
MODELS = {"object": "list", "data": [{"id": "Wan-AI/Wan2.2-TI2V-5B-Diffusers"}]}
PROXY_VARS = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")


@pytest.fixture
def hostile_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """HOME with a `default` netrc entry, and every proxy variable aimed at a recording listener."""
    home = tmp_path / "home"
    home.mkdir()
    netrc = home / ".netrc"
    netrc.write_text("default login netrc-user password netrc-secret\n")
    netrc.chmod(0o600)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("NETRC", str(netrc))
    ambient = HostileServer({})          # any request reaching it is a leak: it answers 404 and keeps it
    for var in PROXY_VARS:
        monkeypatch.setenv(var, ambient.url)
    for var in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(var, raising=False)
    yield ambient
    ambient.close()


@pytest.fixture
def origin_server():
    server = HostileServer({("GET", "/v1/models"): answer(200, MODELS)})
    yield server
    server.close()


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


@pytest.mark.parametrize("spelling", ["127.0.0.1", "localhost", "127.1", "0x7f.1", "0177.0.0.1",
                                      "2130706433"])
@pytest.mark.parametrize("key", [KEY, None])
def test_no_netrc_credentials_and_no_ambient_proxy_under_any_loopback_spelling(hostile_env, origin_server,
                                                                               spelling, key) -> None:
    url = f"http://{spelling}:{_port(origin_server.url)}"
    with VideoClient(url, api_key=key) as client:
        assert client.models() == ["Wan-AI/Wan2.2-TI2V-5B-Diffusers"]
    (call,) = origin_server.calls("GET", "/v1/models")
    assert call.headers.get("authorization") == (f"Bearer {KEY}" if key else None), "netrc replaced nothing"
    assert "netrc" not in json.dumps(call.headers) and hostile_env.log == []
    assert is_loopback_host(spelling)                 # and so no configured proxy would be used for it either


def test_a_remote_server_goes_through_the_configured_proxy_only(hostile_env, tmp_path, monkeypatch) -> None:
    remote = "http://gpu-box.invalid:8091"
    configured = HostileServer({("GET", f"{remote}/v1/models"): answer(200, MODELS)})   # a proxy gets the URL
    try:
        config = tmp_path / "launcher.json"
        config.write_text(json.dumps({
            "remote_proxy": configured.url,
            "remote_servers": {"box": {"url": remote, "api_key": KEY}}}))
        monkeypatch.setenv("VLLM_OMNI_LAUNCHER_CONFIG", str(config))
        assert load_local_config().remote_proxy == configured.url
        handle = session.connect_remote("", "ti2v_5b", "box", node_id=None)   # the Remote Server node's path
        assert handle.served_name == "Wan-AI/Wan2.2-TI2V-5B-Diffusers"
        (call,) = configured.log
        assert (call.method, call.path) == ("GET", f"{remote}/v1/models")   # sent to the configured proxy
        assert call.headers.get("authorization") == f"Bearer {KEY}"         # our key, to its origin, not netrc's
        assert "netrc-secret" not in json.dumps(call.headers) and "proxy-authorization" not in call.headers
        assert hostile_env.log == []                                        # the environment's proxy: never
    finally:
        configured.close()


def test_the_configured_proxy_is_never_used_for_a_loopback_server(hostile_env, origin_server) -> None:
    configured = HostileServer({})
    try:
        for host in ("127.0.0.1", "0x7f.1", "localhost"):
            with VideoClient(f"http://{host}:{_port(origin_server.url)}", proxy=configured.url) as client:
                client.models()
        assert configured.log == [] and hostile_env.log == []
        assert len(origin_server.calls("GET", "/v1/models")) == 3
    finally:
        configured.close()


@pytest.mark.parametrize("spelling, address", [("127.1", "127.0.0.1"), ("0x7f.1", "127.0.0.1"),
                                               ("0177.0.0.1", "127.0.0.1"), ("2130706433", "127.0.0.1"),
                                               ("10.1", "10.0.0.1"), ("0xc0.0xa8.1.2", "192.168.1.2")])
def test_a_numeric_host_is_the_address_the_resolver_reads_and_no_second_origin(spelling, address,
                                                                                tmp_path, monkeypatch) -> None:
    assert numeric_ipv4(spelling) == address
    with pytest.raises(LauncherError) as err:
        origin(f"http://{spelling}:8091")
    assert err.value.setting == "url" and address in err.value.why        # "write 127.0.0.1"
    config = tmp_path / "launcher.json"
    config.write_text(json.dumps({"remote_servers": {"box": {"url": f"http://{address}:8091", "api_key": KEY}}}))
    monkeypatch.setenv("VLLM_OMNI_LAUNCHER_CONFIG", str(config))
    assert load_local_config().api_key_for(f"http://{spelling}:8091") is None   # no key under another spelling


@pytest.mark.parametrize("host", ["gpu-box", "0xdead.example", "1.2.3.4.5", "256.1.1.1", "08.1.1.1", "[::1]x"])
def test_names_and_invalid_numbers_are_not_read_as_addresses(host) -> None:
    assert numeric_ipv4(host) is None


def test_proxy_setting_is_checked_and_its_password_never_shown(tmp_path, monkeypatch) -> None:
    config = tmp_path / "launcher.json"
    monkeypatch.setenv("VLLM_OMNI_LAUNCHER_CONFIG", str(config))
    config.write_text(json.dumps({"remote_proxy": "socks5://proxy:1080"}))
    with pytest.raises(LauncherError) as err:
        load_local_config()
    assert err.value.setting == "remote_proxy" and "http://" in err.value.why
    config.write_text(json.dumps({"remote_proxy": "http://me:hunter2@proxy:3128"}))
    assert "hunter2" not in repr(load_local_config())


def test_an_unreachable_remote_names_the_setting_when_the_environment_has_a_proxy(monkeypatch) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://corp-proxy:3128")
    assert "remote_proxy" in env_proxy_note(os.environ) and "HTTPS_PROXY" in env_proxy_note(os.environ)
    assert env_proxy_note({}) == ""
    remote: Any = Transport("http://gpu-box.invalid:8091")
    local: Any = Transport("http://127.0.0.1:8091")
    assert "remote_proxy" in remote._unreachable_note and local._unreachable_note == ""
    assert remote.session.trust_env is False and local.session.trust_env is False
