"""A remote server's key never reaches a server the launcher starts: the variable a configured
`api_key_env` names is withheld from the launched server's environment (and from the version
probe, which runs the server environment's python the same way) even when its prefix (VLLM_,
HF_, CUDA_, TORCH_) is otherwise passed on; the rest of the allow-list is unchanged."""
from __future__ import annotations

import json
import os
import sys

import pytest

from vllm_omni_launcher.errors import LauncherError
from vllm_omni_launcher.server.config.environment import server_environment
from vllm_omni_launcher.server.config.local_config import LocalConfig, load_local_config
from vllm_omni_launcher.server.launch import versions

KEY_VARS = {"VLLM_GPU_BOX_KEY": "remote-secret-1", "HF_BOX_KEY": "remote-secret-2",
            "CUDA_BOX_KEY": "remote-secret-3", "TORCH_BOX_KEY": "remote-secret-4"}
PARENT = {"PATH": "/usr/bin", "HF_HOME": "/data/hf", "HF_TOKEN": "hf_abc", "VLLM_LOGGING_LEVEL": "DEBUG",
          "CUDA_HOME": "/usr/local/cuda", **KEY_VARS}


@pytest.fixture
def config(tmp_path, monkeypatch):
    """A local config whose remote servers take their keys from KEY_VARS (and one from the file)."""
    servers = {name.lower(): {"url": f"http://box{i}.example:8091", "api_key_env": name}
               for i, name in enumerate(KEY_VARS)}
    servers["filed"] = {"url": "http://filed.example:8091", "api_key": "in-the-file"}
    path = tmp_path / "launcher.json"
    path.write_text(json.dumps({"remote_servers": servers}))
    monkeypatch.setenv("VLLM_OMNI_LAUNCHER_CONFIG", str(path))
    return load_local_config({**PARENT, "VLLM_OMNI_LAUNCHER_CONFIG": str(path)})


def test_the_config_knows_which_variables_hold_remote_keys(config):
    assert config.key_variables() == frozenset(KEY_VARS)
    assert {s.name: s.api_key for s in config.remote_servers.values()}["vllm_gpu_box_key"] == "remote-secret-1"


def test_a_launched_server_never_gets_a_remote_key_variable(config):
    env = server_environment(PARENT, config, {"VLLM_API_KEY": "launch-key"})
    assert not set(KEY_VARS) & set(env)
    assert not set(KEY_VARS.values()) & set(env.values())
    assert {k: env[k] for k in ("PATH", "HF_HOME", "HF_TOKEN", "VLLM_LOGGING_LEVEL", "CUDA_HOME")} == {
        k: PARENT[k] for k in ("PATH", "HF_HOME", "HF_TOKEN", "VLLM_LOGGING_LEVEL", "CUDA_HOME")}
    assert env["VLLM_API_KEY"] == "launch-key"


def test_without_remote_servers_the_same_variables_pass_as_before():
    assert LocalConfig().key_variables() == frozenset()
    assert server_environment(PARENT, LocalConfig(), {})["VLLM_GPU_BOX_KEY"] == "remote-secret-1"


def test_the_version_probe_withholds_them_too(config, tmp_path, monkeypatch):
    """The probe runs the server command's python with a launch's environment: a python wrapper
    that records what it was given shows no remote key."""
    seen = tmp_path / "probe-env.json"
    wrapper = tmp_path / "python-recording"
    wrapper.write_text(f"#!/bin/sh\n{sys.executable} -c 'import json, os; json.dump(dict(os.environ), "
                       f"open(\"{seen}\", \"w\"))'\nexec {sys.executable} \"$@\"\n")
    wrapper.chmod(0o755)
    for name, value in PARENT.items():
        monkeypatch.setenv(name, value)
    probed = load_local_config({**os.environ, "VLLM_OMNI_LAUNCHER_SERVER_CMD": str(wrapper)})
    with pytest.raises(LauncherError):               # this test venv has no vllm: refused after the probe
        versions.checked_server_version(probed)
    env = json.loads(seen.read_text())
    assert not set(KEY_VARS) & set(env) and env["HF_HOME"] == "/data/hf"
