"""A head whose server would get VLLM_PORT is refused before anything starts.

With VLLM_PORT, vLLM draws every port from that number upward, and vLLM-Omni 0.30's head then keeps
drawing the ports it already handed out: its registration thread crashed on the first remote replica
("Could not allocate 3 unique open ports"; bench/netns_head_replica.py, phase 0, on two network
namespaces). So `serve --accept-replicas` refuses VLLM_PORT from extra_env or from its own environment
(the server inherits VLLM_* variables), naming the setting and the way to narrow the ports instead.
"""
from __future__ import annotations

import pytest

from vllm_omni_launcher.errors import LauncherError
from vllm_omni_launcher.server.config.local_config import LocalConfig
from vllm_omni_launcher.server.supervision.multi_host import HeadRole, JoinRole


def test_vllm_port_in_extra_env_refuses_a_head_naming_the_setting(monkeypatch):
    monkeypatch.delenv("VLLM_PORT", raising=False)
    with pytest.raises(LauncherError) as err:
        HeadRole.from_config(29555, LocalConfig(extra_env={"VLLM_PORT": "29600"}))
    e = err.value
    assert e.setting == "extra_env" and "(extra_env)" in e.what and "Could not allocate 3 unique open ports" in e.why
    assert "ip_local_port_range" in e.fix


def test_vllm_port_inherited_from_the_environment_refuses_a_head(monkeypatch):
    monkeypatch.setenv("VLLM_PORT", "29600")
    with pytest.raises(LauncherError) as err:
        HeadRole.from_config(29555, LocalConfig())
    assert "(the environment)" in err.value.what


def test_a_head_without_vllm_port_and_a_joined_replica_with_it_start(monkeypatch):
    monkeypatch.delenv("VLLM_PORT", raising=False)
    assert HeadRole.from_config(29555, LocalConfig()).port == 29555
    monkeypatch.setenv("VLLM_PORT", "29600")              # a replica allocates none of the head's ports
    assert JoinRole.from_config("10.0.0.5:29555", LocalConfig()).port == 29555
