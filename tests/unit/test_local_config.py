"""The local config: keys only for the origins the operator names, and every bad setting explained."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from vllm_omni_launcher.client.origins import key_setup_hint
from vllm_omni_launcher.errors import LauncherError
from vllm_omni_launcher.server.config import local_config
from vllm_omni_launcher.server.config.local_config import LocalConfig, RemoteServer, load_local_config, origin


def _load(tmp_path: Path, data: Any = None, **env: str) -> LocalConfig:
    """load_local_config with `data` as the file (None: no file) and exactly `env` as the environment."""
    path = tmp_path / "launcher.json"
    if data is not None:
        path.write_text(data if isinstance(data, str) else json.dumps(data))
    return load_local_config({"VLLM_OMNI_LAUNCHER_CONFIG": str(path), **env})


def _error(tmp_path: Path, data: Any = None, **env: str) -> LauncherError:
    with pytest.raises(LauncherError) as err:
        _load(tmp_path, data, **env)
    return err.value


# ---- origin() ---------------------------------------------------------------------------------
@pytest.mark.parametrize("url, expected", [
    ("http://127.0.0.1:3109", "http://127.0.0.1:3109"),
    ("HTTP://GPU-Box:8091/v1", "http://gpu-box:8091"),           # scheme and host lowercased, path dropped
    ("http://gpu-box.:8091", "http://gpu-box:8091"),              # trailing dot of an absolute name
    ("http://gpu-box", "http://gpu-box:80"),                      # default ports filled
    ("https://gpu-box/", "https://gpu-box:443"),
    ("http://gpu-box:80", "http://gpu-box:80"),
    ("http://[::1]:8091", "http://[::1]:8091"),                   # IPv6 stays bracketed
    ("http://[0:0:0:0:0:0:0:1]", "http://[::1]:80"),              # and is compressed
    ("https://bücher.example", "https://xn--bcher-kva.example:443"),   # IDNA, as requests sends it
    ("http://h/private?x=1#y", "http://h:80"),
    ("  http://h:9000  ", "http://h:9000"),
])
def test_origin_normalises(url: str, expected: str) -> None:
    assert origin(url) == expected


@pytest.mark.parametrize("url, why", [
    ("http://user:pw@gpu-box:8091", "user name or password"),
    ("http://gpu-box@attacker.example", "user name or password"),
    ("ftp://gpu-box", "http:// or https://"),
    ("gpu-box:8091", "http:// or https://"),
    ("*", "http:// or https://"),
    ("http://", "no host"),
    ("http://gpu-box:99999", "1 to 65535"),
    ("http://gpu-box:80x", "1 to 65535"),
    ("http://::1:8091", "brackets"),
    ("http://[::1", "not closed"),
    ("http://gpu box", "spaces"),
    ("http://gpu-box\\.attacker.example", "not a valid host name"),
    ("http://*.example", "not a valid host name"),
    ("http://127.1", "not a valid IPv4 address"),
])
def test_origin_refuses(url: str, why: str) -> None:
    with pytest.raises(LauncherError) as err:
        origin(url)
    assert err.value.setting == "url" and why in err.value.why


def test_origin_error_never_repeats_a_password() -> None:
    with pytest.raises(LauncherError) as err:
        origin("http://me:hunter2@gpu-box:8091")
    assert "hunter2" not in str(err.value)


# ---- keys go to exact origins only ----------------------------------------------------------------
@pytest.mark.parametrize("configured, asked, gets_key", [
    ("http://127.0.0.1:3109", "http://127.0.0.1:31091", False),          # prefix of the port
    ("http://gpu-box", "http://gpu-box.attacker.example", False),         # prefix of the host
    ("http://gpu-box", "http://gpu-box:8080", False),                     # other port
    ("http://gpu-box", "https://gpu-box", False),                         # other scheme
    ("http://gpu-box:8091", "http://attacker.example/http://gpu-box:8091", False),
    ("http://gpu-box:8091", "http://attacker.example:8091?gpu-box", False),
    ("http://gpu-box:8091", "http://gpu-box:8091@attacker.example", False),  # userinfo trick: refused
    ("http://gpu-box:8091", "not a url", False),
    ("http://127.0.0.1:3109", "http://127.0.0.1:3109/v1", True),
    ("http://gpu-box", "http://GPU-BOX:80/", True),
    ("http://gpu-box.", "http://gpu-box", True),
    # Same origin, same server: the path is not part of where a key goes, by design.
    ("http://h/private", "http://h/private-attacker", True),
])
def test_keys_match_by_origin(tmp_path: Path, configured: str, asked: str, gets_key: bool) -> None:
    config = _load(tmp_path, {"remote_servers": {"box": {"url": configured, "api_key": "k-box"}}})
    assert config.api_key_for(asked) == ("k-box" if gets_key else None)
    legacy = _load(tmp_path, {"remote_api_keys": {configured: "k-old"}})
    assert legacy.api_key_for(asked) == ("k-old" if gets_key else None)


def test_a_star_key_is_refused_with_the_reason(tmp_path: Path) -> None:
    err = _error(tmp_path, {"remote_api_keys": {"*": "k-any"}})
    assert err.setting == "remote_api_keys" and str(tmp_path / "launcher.json") in err.what
    assert "only to the origins the operator names" in err.why and "shared workflow" in err.why
    assert "server's origin" in err.fix and "k-any" not in str(err)


def test_env_key_goes_only_to_the_env_url(tmp_path: Path) -> None:
    config = _load(tmp_path, VLLM_OMNI_LAUNCHER_REMOTE_URL="http://127.0.0.1:3109",
                   VLLM_OMNI_LAUNCHER_REMOTE_API_KEY="k-env")
    assert config.api_key_for("http://127.0.0.1:3109/v1") == "k-env"
    assert config.api_key_for("http://127.0.0.1:31091") is None
    assert config.api_key_for("http://attacker.example") is None
    assert config.remote_servers == {"env": RemoteServer("env", "http://127.0.0.1:3109", "k-env")}


def test_env_key_without_url_is_refused(tmp_path: Path) -> None:
    err = _error(tmp_path, VLLM_OMNI_LAUNCHER_REMOTE_API_KEY="k-env")
    assert "VLLM_OMNI_LAUNCHER_REMOTE_URL" in err.what and "set VLLM_OMNI_LAUNCHER_REMOTE_URL" in err.fix
    assert "k-env" not in str(err)


def test_env_url_without_key_is_a_keyless_server(tmp_path: Path) -> None:
    config = _load(tmp_path, VLLM_OMNI_LAUNCHER_REMOTE_URL="http://127.0.0.1:3109")
    assert config.remote_servers == {"env": RemoteServer("env", "http://127.0.0.1:3109")}
    assert config.api_key_for("http://127.0.0.1:3109") is None


def test_api_key_env_is_read_at_load(tmp_path: Path) -> None:
    data = {"remote_servers": {"box": {"url": "http://gpu-box:8091", "api_key_env": "BOX_KEY"}}}
    assert _load(tmp_path, data, BOX_KEY="k-from-env").api_key_for("http://gpu-box:8091") == "k-from-env"
    err = _error(tmp_path, data)
    assert "BOX_KEY" in err.why and "not set" in err.why and "export BOX_KEY" in err.fix


def test_named_servers_get_their_keys_by_origin(tmp_path: Path) -> None:
    config = _load(tmp_path, {"remote_servers": {"box": {"url": "http://gpu-box:8091/", "api_key": "k"},
                                                 "open": {"url": "http://127.0.0.1:9000"}}})
    assert config.remote_servers["box"].api_key == "k" and config.remote_servers["open"].api_key is None
    assert config.api_key_for("http://GPU-BOX:8091/v1") == "k"
    assert config.api_key_for("http://gpu-box:8092") is None and config.api_key_for("http://127.0.0.1:9000") is None


@pytest.mark.parametrize("entry, why", [
    ({"url": "http://me:pw@gpu-box"}, "user name or password"),
    ({"url": "*", "api_key": "k"}, "http:// or https://"),
    ({"api_key": "k"}, "no \"url\""),
    ({"url": "http://gpu-box", "apikey": "k"}, "unknown key 'apikey'"),
    ({"url": "http://gpu-box", "api_key": "k", "api_key_env": "X"}, "both api_key and api_key_env"),
    ({"url": "http://gpu-box", "api_key": 42}, "not a non-empty string"),
])
def test_bad_remote_server_entries_are_explained(tmp_path: Path, entry: dict, why: str) -> None:
    err = _error(tmp_path, {"remote_servers": {"box": entry}})
    assert err.setting == "remote_servers" and why in err.why and "remote_servers.box" in err.why
    assert ":pw@" not in str(err)


def test_did_you_mean_inside_a_remote_server(tmp_path: Path) -> None:
    err = _error(tmp_path, {"remote_servers": {"box": {"url": "http://gpu-box", "apikey": "k"}}})
    assert "did you mean 'api_key'" in err.fix


def test_one_origin_with_two_keys_is_refused(tmp_path: Path) -> None:
    err = _error(tmp_path, {"remote_servers": {"a": {"url": "http://gpu-box:80", "api_key": "k1"}},
                            "remote_api_keys": {"http://GPU-BOX/": "k2"}})
    assert "same origin http://gpu-box:80" in err.what and "k1" not in str(err) and "k2" not in str(err)


# ---- settings validated once -----------------------------------------------------------------
def test_a_string_port_names_the_key_and_the_fix(tmp_path: Path) -> None:
    err = _error(tmp_path, {"port": "8091"})
    path = str(tmp_path / "launcher.json")
    assert err.setting == "port" and "'port'" in err.what and path in err.what
    assert "expects an integer" in err.why and '"8091"' in err.why
    assert '"port": 8091 ' in err.fix and path in err.fix


def test_a_word_for_a_number_is_explained(tmp_path: Path) -> None:
    err = _error(tmp_path, {"keep_alive_minutes": "ten"})
    assert err.setting == "keep_alive_minutes" and "expects a number" in err.why and '"ten"' in err.why
    assert '"keep_alive_minutes": 10' in err.fix


@pytest.mark.parametrize("data, setting, why", [
    ({"trust_remote_code": "yes"}, "trust_remote_code", "true or false"),
    ({"port": True}, "port", "an integer"),
    ({"port": 70000}, "port", "from 1 to 65535"),
    ({"hang_timeout_s": 0}, "hang_timeout_s", "greater than 0"),
    ({"keep_alive_minutes": -1}, "keep_alive_minutes", "0 or more"),
    ({"server_command": [1, 2]}, "server_command", "a string or a list of strings"),
    ({"extra_env": {"HF_HUB_OFFLINE": True}}, "extra_env", "'HF_HUB_OFFLINE' is true, not a string"),
    ({"extra_env": {"VLLM_API_KEY": "x"}}, "extra_env", "reserved"),
    ({"extra_env": {"VLLM_OMNI_LAUNCHER_REMOTE_API_KEY": "x"}}, "extra_env", "reserved"),
    ({"extra_env": {"BAD NAME": "x"}}, "extra_env", "not an environment variable name"),
    ({"host": ""}, "host", "must not be empty"),
])
def test_wrong_values_name_their_setting(tmp_path: Path, data: dict, setting: str, why: str) -> None:
    err = _error(tmp_path, data)
    assert err.setting == setting and why in err.why and str(tmp_path / "launcher.json") in err.what


def test_unknown_key_gets_a_did_you_mean(tmp_path: Path) -> None:
    err = _error(tmp_path, {"sever_env": "~/env"})
    assert err.setting == "sever_env" and "Unknown setting 'sever_env'" in err.what
    assert "no effect" in err.why and "did you mean 'server_env'" in err.fix


def test_unknown_key_without_a_near_name_lists_the_settings(tmp_path: Path) -> None:
    err = _error(tmp_path, {"zzz": 1})
    assert "server_env" in err.fix and "remote_servers" in err.fix


@pytest.mark.parametrize("text, why", [("{not json", "Expecting"), ("[1, 2]", "a list")])
def test_unreadable_file_is_explained(tmp_path: Path, text: str, why: str) -> None:
    err = _error(tmp_path, text)
    assert str(tmp_path / "launcher.json") in err.what and why in err.why


@pytest.mark.parametrize("var, value, why", [
    ("VLLM_OMNI_LAUNCHER_PORT", "abc", "expects an integer"),
    ("VLLM_OMNI_LAUNCHER_PORT", "0", "from 1 to 65535"),
    ("VLLM_OMNI_LAUNCHER_KEEP_ALIVE_MINUTES", "ten", "expects a number"),
    ("VLLM_OMNI_LAUNCHER_HANG_TIMEOUT_S", "nan", "expects a number"),
    ("VLLM_OMNI_LAUNCHER_TRUST_REMOTE_CODE", "maybe", "true or false"),
    ("VLLM_OMNI_LAUNCHER_SERVER_CMD", "'unclosed", "a string or a list"),
    ("VLLM_OMNI_LAUNCHER_REMOTE_URL", "gpu-box:8091", "http:// or https://"),
])
def test_bad_env_values_name_the_variable(tmp_path: Path, var: str, value: str, why: str) -> None:
    err = _error(tmp_path, **{var: value})
    assert var in err.what and why in err.why and var in err.fix


def test_env_overrides_the_file_and_converts(tmp_path: Path) -> None:
    config = _load(tmp_path, {"port": 8000, "server_command": "/opt/env/bin/vllm --x", "keep_alive_minutes": 5},
                   VLLM_OMNI_LAUNCHER_PORT="8091", VLLM_OMNI_LAUNCHER_TRUST_REMOTE_CODE="off",
                   VLLM_OMNI_LAUNCHER_CONNECT_TIMEOUT_S="2.5", VLLM_OMNI_LAUNCHER_HOST="  ")
    assert config.port == 8091 and config.trust_remote_code is False and config.connect_timeout_s == 2.5
    assert config.server_command == ("/opt/env/bin/vllm", "--x") and config.keep_alive_minutes == 5.0
    assert config.host == "127.0.0.1"           # a blank variable counts as unset


def test_defaults_without_a_file(tmp_path: Path) -> None:
    config = _load(tmp_path)
    assert (config.connect_timeout_s, config.first_byte_timeout_s, config.body_timeout_s) == (5.0, 30.0, 600.0)
    assert config.data_dir and config.remote_servers == {} and config.api_key_for("http://127.0.0.1:1") is None


def test_direct_construction_is_validated_too() -> None:
    with pytest.raises(LauncherError) as err:
        LocalConfig(extra_env={"VLLM_API_KEY": "x"})
    assert err.value.setting == "extra_env"
    with pytest.raises(LauncherError):
        RemoteServer("box", "http://u:p@gpu-box")


# ---- secrets ---------------------------------------------------------------------------------
def test_repr_masks_extra_env_secrets_and_never_shows_remote_keys(tmp_path: Path) -> None:
    config = _load(tmp_path, {"extra_env": {"HF_TOKEN": "hf_secret1", "HF_HOME": "/data/hf",
                                            "HTTPS_PROXY": "http://me:proxypw@proxy:3128"},
                              "remote_servers": {"box": {"url": "http://gpu-box", "api_key": "k-remote1"}},
                              "remote_api_keys": {"http://other:1": "k-remote2"}},
                   VLLM_OMNI_LAUNCHER_REMOTE_URL="http://third:2", VLLM_OMNI_LAUNCHER_REMOTE_API_KEY="k-remote3")
    text = repr(config) + str(config) + repr(config.remote_servers)
    for secret in ("hf_secret1", "proxypw", "k-remote1", "k-remote2", "k-remote3"):
        assert secret not in text
    assert "/data/hf" in text and "http://gpu-box" in text and "'HF_TOKEN': '***'" in text


# ---- reference -------------------------------------------------------------------------------
def test_config_reference_lists_every_setting_once() -> None:
    table = local_config.config_reference()
    for name in ("server_env", "port", "connect_timeout_s", "first_byte_timeout_s", "body_timeout_s",
                 "remote_servers", "extra_env"):
        assert table.count(f"| `{name}` |") == 1
    assert "`VLLM_OMNI_LAUNCHER_SERVER_CMD`" in table and "`VLLM_OMNI_LAUNCHER_REMOTE_URL`" in table
    assert "| `VLLM_OMNI_LAUNCHER_HANG_TIMEOUT_S` | `hang_timeout_s` | number | `120` |" in table


def test_key_setup_hint_names_the_origin() -> None:
    hint = key_setup_hint("http://GPU-box:8091/v1")
    assert '"url": "http://gpu-box:8091"' in hint and "VLLM_OMNI_LAUNCHER_REMOTE_URL=http://gpu-box:8091" in hint


def test_readme_config_table_is_the_generated_reference() -> None:
    """The README's settings table is config_reference() verbatim, so it cannot drift from the code."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    block = readme.split("<!-- config-reference:start -->\n", 1)[1].split("\n<!-- config-reference:end -->", 1)[0]
    assert block.strip() == local_config.config_reference().strip()
