"""A head refuses a replica registration address that is not private unless the local config allows it.

Upstream's registration port (and the head's per-replica ports on the same address) has no
authentication, so `serve --accept-replicas` with a public or wildcard `replica_registration_host`
stops before anything is planned or started, with our own text naming both settings; the operator's
explicit `allow_public_replica_registration` lets it through, with the warning every open head gets.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from vllm_omni_launcher.cli import serve_cmd
from vllm_omni_launcher.errors import LauncherError
from vllm_omni_launcher.server.supervision import replica_network
from vllm_omni_launcher.server.config.local_config import LocalConfig, config_reference, load_local_config
from vllm_omni_launcher.server.supervision.multi_host import HeadRole


@pytest.mark.parametrize("host", ["127.0.0.1", "::1", "10.0.0.5", "172.20.1.2", "192.168.1.10", "100.101.102.103",
                                  "169.254.3.4", "fd12:3456::1", "::ffff:192.168.0.9", "localhost"])
def test_a_private_registration_address_starts_a_head(host):
    head = HeadRole.from_config(29555, LocalConfig(replica_registration_host=host))
    assert head.host == host


@pytest.mark.parametrize("host, why", [("203.0.113.7", "is not a private address"),
                                       ("8.8.8.8", "is not a private address"),
                                       ("2001:db8::1", "is not a private address"),
                                       ("0.0.0.0", "wildcard"), ("::", "wildcard"), ("*", "wildcard"),
                                       ("no-such-host.invalid", "does not resolve")])
def test_a_public_or_wildcard_registration_address_is_refused_naming_the_settings(host, why):
    with pytest.raises(LauncherError) as err:
        HeadRole.from_config(29555, LocalConfig(replica_registration_host=host))
    e = err.value
    assert e.setting == "replica_registration_host" and e.kind == "config"
    assert host in e.what and why in e.why and "no authentication" in e.why
    assert "replica_registration_host" in e.fix and '"allow_public_replica_registration": true' in e.fix


def test_a_name_is_private_only_when_every_address_it_resolves_to_is(monkeypatch):
    def resolve(host, port, proto=0):
        return [(2, 1, 6, "", ("10.0.0.5", 0)), (2, 1, 6, "", ("198.51.100.4", 0))]
    monkeypatch.setattr(replica_network.socket, "getaddrinfo", resolve)
    assert "198.51.100.4" in replica_network.public_reason("head.lan")
    monkeypatch.setattr(replica_network.socket, "getaddrinfo", lambda *a, **k: [(2, 1, 6, "", ("10.0.0.5", 0))])
    assert replica_network.public_reason("head.lan") == ""


def test_the_local_config_can_allow_a_public_address_explicitly(tmp_path: Path):
    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps({"replica_registration_host": "203.0.113.7", "allow_public_replica_registration": True}))
    head = HeadRole.from_config(29555, load_local_config({"VLLM_OMNI_LAUNCHER_CONFIG": str(cfg)}))
    assert head.host == "203.0.113.7" and "NO authentication" in head.warnings()[0]
    env = load_local_config({"VLLM_OMNI_LAUNCHER_CONFIG": str(tmp_path / "none.json"),
                             "VLLM_OMNI_LAUNCHER_REPLICA_REGISTRATION_HOST": "203.0.113.7",
                             "VLLM_OMNI_LAUNCHER_ALLOW_PUBLIC_REPLICA_REGISTRATION": "true"})
    assert HeadRole.from_config(29555, env).host == "203.0.113.7"
    assert "`allow_public_replica_registration`" in config_reference()


def test_serve_refuses_the_public_head_before_planning_anything(monkeypatch):
    monkeypatch.setattr(serve_cmd, "load_local_config", lambda: LocalConfig(replica_registration_host="8.8.8.8"))

    def planned(*args, **kwargs):
        raise AssertionError("the launch was planned for a refused head")
    monkeypatch.setattr(serve_cmd, "launch_from_args", planned)
    args = argparse.Namespace(join=None, accept_replicas=29555, api_key_file=None, no_api_key=False,
                              api_key_from=None, print_systemd_unit=False)
    with pytest.raises(LauncherError) as err:
        serve_cmd.run(args)
    assert err.value.setting == "replica_registration_host"
