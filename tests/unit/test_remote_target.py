"""Which server a Remote Server node reaches, with which key (server/config/remote_servers.py): a
configured name brings its own URL and key, a typed URL gets a key only for an origin the config
names, and the node's list and cache identity never fail on a broken config."""
from __future__ import annotations

import json

import pytest

from vllm_omni_launcher.errors import LauncherError
from vllm_omni_launcher.server.config.local_config import load_local_config
from vllm_omni_launcher.server.config.remote_servers import USE_URL, remote_choices, remote_identity, remote_target


@pytest.fixture
def config_file(tmp_path, monkeypatch):
    path = tmp_path / "launcher.json"
    path.write_text(json.dumps({"remote_servers": {"box": {"url": "http://127.0.0.1:8091/", "api_key": "k"}}}))
    monkeypatch.setenv("VLLM_OMNI_LAUNCHER_CONFIG", str(path))
    return path


def test_a_configured_name_brings_its_url_and_key_whatever_the_url_widget_says(config_file):
    assert remote_target(load_local_config(), "http://elsewhere.invalid", "box") == ("box", "http://127.0.0.1:8091",
                                                                                       "k")


def test_a_typed_url_loses_v1_and_gets_a_key_only_for_a_configured_origin(config_file):
    config = load_local_config()
    assert remote_target(config, " http://127.0.0.1:8091/v1/ ", USE_URL) == ("", "http://127.0.0.1:8091", "k")
    assert remote_target(config, "http://localhost:8091", USE_URL) == ("", "http://localhost:8091", None)
    with pytest.raises(LauncherError) as err:
        remote_target(config, "ftp://127.0.0.1:8091", USE_URL)
    assert err.value.setting == "url"


def test_an_unknown_name_says_where_remote_servers_are_configured(config_file):
    with pytest.raises(LauncherError) as err:
        remote_target(load_local_config(), "http://127.0.0.1:8091", "gpu-box")
    assert err.value.what == ('Remote Server got the string "gpu-box" as remote_server, which is not configured on '
                              "this machine")
    assert err.value.setting == "remote_server" and f"pick '{USE_URL}'" in err.value.fix


def test_the_list_and_the_identity_survive_a_broken_config(config_file):
    assert remote_choices(load_local_config) == [USE_URL, "box"]
    assert remote_identity(load_local_config, "ignored", "box") == "box=http://127.0.0.1:8091/"
    config_file.write_text("{not json")
    assert remote_choices(load_local_config) == [USE_URL]
    assert remote_identity(load_local_config, "ignored", "box") == "box="
    assert remote_identity(load_local_config, " http://x:1 ", USE_URL) == "http://x:1"
