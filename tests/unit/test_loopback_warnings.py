"""Which `serve` warnings say "anyone can reach it": loopback in any spelling is this machine only
(client/hosts.is_loopback_host is the one reading), every other address is open."""
from __future__ import annotations

import pytest

from vllm_omni_launcher.cli import serve_cmd
from vllm_omni_launcher.server.supervision.multi_host import HeadRole

LOOPBACK = ["127.0.0.1", "127.0.0.2", "127.1", "localhost", "::1", "[::1]", "::ffff:127.0.0.1"]
OPEN = ["0.0.0.0", "::", "10.0.0.5", "192.168.1.20", "gpu-box.lan"]


@pytest.mark.parametrize("host", LOOPBACK)
def test_serve_without_a_key_on_loopback_is_not_called_open(host: str) -> None:
    assert not serve_cmd.open_without_key(host)


@pytest.mark.parametrize("host", OPEN)
def test_serve_without_a_key_on_any_other_address_is(host: str) -> None:
    assert serve_cmd.open_without_key(host)


@pytest.mark.parametrize("host", LOOPBACK)
def test_a_head_registering_on_loopback_accepts_this_machine_only(host: str) -> None:
    (warning,) = HeadRole(host, 29555, 900.0).warnings()
    assert "only from this machine" in warning and "NO authentication" not in warning


@pytest.mark.parametrize("host", OPEN)
def test_a_head_registering_elsewhere_warns_it_has_no_authentication(host: str) -> None:
    (warning,) = HeadRole(host, 29555, 900.0).warnings()
    assert "NO authentication" in warning
