"""What a URL's host really names: the one reading of numeric IPv4 forms and of loopback.

The resolver the HTTP stack uses (getaddrinfo, which tries inet_aton first) reads "127.1",
"0x7f.1", "0177.0.0.1" and "2130706433" as 127.0.0.1, so a host written that way IS that
address. Origins (server/config/remote_servers.py) compare it in dotted form, so a key configured for
http://127.0.0.1:8091 and a workflow URL http://0x7f.1:8091 are seen as the one server they are,
and the transport's loopback test (no proxy for our own servers) cannot be sidestepped by
spelling. The parsing follows inet_aton (and the WHATWG URL standard's IPv4 parser): one to four
parts, each decimal, 0x-hex or 0-octal, the last filling the bytes left.
"""
from __future__ import annotations

import ipaddress
from typing import Optional
from urllib.parse import urlsplit


def _number(part: str) -> Optional[int]:
    """One part of a numeric IPv4 host ("0x7f", "0177", "127"), or None when it is not a number."""
    text = part.lower()
    if text.startswith("0x"):
        digits, base = text[2:], 16
        if not digits:
            return 0
    elif len(text) > 1 and text.startswith("0"):
        digits, base = text[1:], 8
    else:
        digits, base = text, 10
    if not digits or not all(ch in "0123456789abcdef"[:base] for ch in digits):
        return None
    return int(digits, base)


def numeric_ipv4(host: str) -> Optional[str]:
    """The dotted IPv4 address a numeric host spells ("0x7f.1" -> "127.0.0.1"), or None when the
    host is not one (a name, IPv6, or numbers out of range, which the resolver would not read
    as an address either)."""
    parts = host.split(".")
    if not 1 <= len(parts) <= 4 or not all(parts) or not host.isascii():
        return None
    values = [_number(part) for part in parts]
    if any(v is None for v in values):
        return None
    head, last = values[:-1], values[-1]
    if any(v > 255 for v in head) or last >= 256 ** (5 - len(values)):   # type: ignore[operator]
        return None
    number = sum(v << (8 * (3 - i)) for i, v in enumerate(head)) + last    # type: ignore[operator]
    return str(ipaddress.IPv4Address(number))


def is_loopback_host(host: str) -> bool:
    """True for a host that can only be this machine: localhost, 127.0.0.0/8 in any spelling,
    ::1, and an IPv4-mapped loopback address (::ffff:127.0.0.1)."""
    name = host.strip().strip("[]").lower().removesuffix(".")
    if name == "localhost":
        return True
    numeric = numeric_ipv4(name)
    try:
        address = ipaddress.ip_address(numeric or name)
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)
    return address.is_loopback or (mapped is not None and mapped.is_loopback)


def is_loopback_url(url: str) -> bool:
    """`is_loopback_host` of a URL's host (False for a URL without one)."""
    try:
        host = urlsplit(url).hostname
    except ValueError:
        return False
    return bool(host) and is_loopback_host(host)
