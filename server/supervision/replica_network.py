"""The network boundary of a head + replicas deployment: which registration addresses a head may bind.

vLLM-Omni's replica registration (the head's `--omni-master-address HOST --omni-master-port PORT`)
is plain msgpack over ZMQ with no authentication: whoever reaches it registers a replica and
receives every prompt and input image. The head also binds, on the same HOST, three ports per
replica (handshake, input, output) and its coordinator's router, all drawn from the ephemeral
range. The replicas connect to all of them; nothing connects to a replica box. So the operator's
boundary is one rule: only the GPU boxes reach HOST (docs/deploy/README.md, "Ports"). `VLLM_PORT`
cannot narrow that range: with it, vLLM draws every port from that number upward, and 0.30's head
keeps drawing the ports it already handed out, so its registration thread crashes on the first
remote replica ("Could not allocate 3 unique open ports", bench/netns_head_replica.py): a head with
VLLM_PORT in its environment is refused (`check_no_vllm_port`).

The launcher enforces the part it can see: HOST must be a private address (loopback, RFC 1918,
100.64/10 as VPNs such as Tailscale use, link-local, IPv6 unique-local) unless the local config's
`allow_public_replica_registration` says otherwise. A wildcard (`0.0.0.0`, `::`, `*`) is refused the
same way: it opens every interface, and upstream would hand it to replicas as the address to connect to.
A name is resolved, and every address it resolves to must be private.
"""
from __future__ import annotations

import ipaddress
import socket
from typing import Mapping, Union

from ...errors import LauncherError
from ...errors.config_names import config_file_path

Address = Union[ipaddress.IPv4Address, ipaddress.IPv6Address]
WILDCARDS = ("0.0.0.0", "::", "*", "")
PRIVATE_NETWORKS = tuple(ipaddress.ip_network(n) for n in (
    "127.0.0.0/8", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16",   # loopback, RFC 1918
    "100.64.0.0/10",                                                  # RFC 6598: VPN overlays (Tailscale)
    "169.254.0.0/16",                                                 # link-local
    "::1/128", "fc00::/7", "fe80::/10"))                              # IPv6 loopback, unique-local, link-local
SETTING = "allow_public_replica_registration"


def is_private(address: Address) -> bool:
    """Whether `address` is in one of PRIVATE_NETWORKS (an IPv4-mapped IPv6 address as its IPv4 one)."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return any(address in network for network in PRIVATE_NETWORKS)


def addresses_of(host: str) -> list[Address]:
    """`host` as addresses: itself when it is an IP literal, else what it resolves to (empty when it
    does not resolve)."""
    try:
        return [ipaddress.ip_address(host.strip("[]").split("%", 1)[0])]
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        return []
    return [ipaddress.ip_address(str(info[4][0]).split("%", 1)[0]) for info in infos]


def public_reason(host: str) -> str:
    """Why `host` is not a private registration address, or "" when it is."""
    if host.strip() in WILDCARDS:
        return f"'{host}' is a wildcard: it binds every interface, public ones included"
    found = addresses_of(host.strip())
    if not found:
        return f"'{host}' does not resolve, so the launcher cannot tell whether it is private"
    public = [str(a) for a in found if not is_private(a)]
    if public:
        shown = host if public == [host] else f"{host} ({', '.join(public)})"
        return f"{shown} is not a private address"
    return ""


def check_registration_host(host: str, allow_public: bool) -> None:
    """Refuse a head whose registration address is not private, unless the local config allows it."""
    why = public_reason(host)
    if why and not allow_public:
        raise LauncherError(
            f"The replica registration address {host} is not on a private network",
            f"{why}; vLLM-Omni's replica registration has no authentication, so whoever reaches it can join as "
            "a replica and receive every prompt and image",
            "set replica_registration_host to this machine's address on a network only your GPU boxes share "
            f"(10.x, 172.16-31.x, 192.168.x, a WireGuard or Tailscale interface); only if a firewall already "
            f"limits who reaches it, set \"{SETTING}\": true in the launcher config ({config_file_path()})",
            setting="replica_registration_host", kind="config")


def check_no_vllm_port(extra_env: Mapping[str, str], environ: Mapping[str, str]) -> None:
    """Refuse a head whose server would get VLLM_PORT (from extra_env, or inherited from serve's own
    environment): see the module docstring."""
    where = "extra_env" if "VLLM_PORT" in extra_env else "the environment" if environ.get("VLLM_PORT") else ""
    if where:
        raise LauncherError(
            f"VLLM_PORT is set ({where}) for a head that accepts replicas",
            "with VLLM_PORT, vLLM draws every port from that number upward, and vLLM-Omni's head then cannot "
            "allocate the ports of a remote replica: its registration thread crashes on the first one "
            "(\"Could not allocate 3 unique open ports\")",
            "remove VLLM_PORT from extra_env in the launcher config, or unset it where serve runs; to narrow the "
            "head's ports, narrow its ephemeral range (sysctl net.ipv4.ip_local_port_range) instead",
            setting="extra_env", kind="config")
