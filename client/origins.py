"""A URL's origin: the one rule for where a key may go, and how to configure a key for one.

A shared workflow chooses the URL a Remote Server node connects to, so a key goes only to the
server the local configuration names with it, compared by ORIGIN (scheme, host, port after
`origin()` normalisation), never by string prefix: a key for http://127.0.0.1:3109 is not sent to
http://127.0.0.1:31091, nor one for http://gpu-box to http://gpu-box.attacker.example. The path is
ignored on purpose: http://h/private and http://h/private-attacker are the same origin, that is the
same server process, and get the same key (a path could never separate two servers anyway).
The configured servers themselves are server/config/remote_servers.py; `key_setup_hint` is the
fix a 401 names.
"""
from __future__ import annotations

import ipaddress
import re
from urllib.parse import urlsplit

from ..errors import LauncherError
from ..errors.config_names import REMOTE_KEY_VAR, REMOTE_URL_VAR, config_file_path
from ..errors.redact import mask_url_password, untrusted_text
from .hosts import numeric_ipv4

DEFAULT_PORTS = {"http": 80, "https": 443}
URL_SHOWN = 200                     # characters of a refused URL an error shows
URL_SCAN = 1024                     # longest URL an error quotes at all (a server's is far shorter)
_LABEL = r"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?"     # DNS: at most 63 characters a label
HOST_MAX = 253                                            # ... and 253 a name (urllib3 raises its own error beyond)
_HOSTNAME = re.compile(rf"{_LABEL}(?:\.{_LABEL})*")


def origin(url: str) -> str:
    """'http://host:port' for `url`: scheme and host lowercased, a trailing dot dropped,
    non-ASCII hosts IDNA-encoded as requests does, IPv6 in brackets, the default port filled.
    An IPv4 address must be written as its dotted quad: the shorthand and hex/octal spellings the
    resolver also reads ("127.1", "0x7f.1", "2130706433") are refused, so one address has one
    origin and a key can never be aimed at a server through another spelling of it.
    Path, query and fragment are ignored. A URL with a user name or password, no http(s)
    scheme, or no valid host raises LauncherError(setting="url")."""
    text = url.strip() if isinstance(url, str) else ""
    if len(text) > URL_SCAN:        # before any part of it is quoted in a reason below
        raise _bad_url(url, f"it is {len(text)} characters long, far more than a server's URL")
    if not text or any(ch.isspace() or not ch.isprintable() for ch in text):
        raise _bad_url(url, "it is empty or contains spaces or control characters")
    try:
        parts = urlsplit(text)
    except ValueError as exc:       # an unbalanced IPv6 bracket
        raise _bad_url(url, "its IPv6 address is not closed by ']' before the port") from exc
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS or not text.lower().startswith(scheme + "://"):
        raise _bad_url(url, "it does not start with http:// or https://")
    netloc = parts.netloc
    if "@" in netloc:
        raise _bad_url(url, "it contains a user name or password before '@'; keys go in the launcher config")
    host, port_text = _split_host_port(url, netloc)
    if port_text and not (port_text.isascii() and port_text.isdigit() and 0 < int(port_text) < 65536):
        raise _bad_url(url, f"port '{port_text}' is not a number from 1 to 65535")
    return f"{scheme}://{host}:{int(port_text) if port_text else DEFAULT_PORTS[scheme]}"


def _split_host_port(url: str, netloc: str) -> tuple[str, str]:
    """The normalised host and the port text ('' when absent) of a URL's netloc."""
    if netloc.startswith("["):
        inside, bracket, rest = netloc[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            raise _bad_url(url, "its IPv6 address is not closed by ']' before the port")
        try:
            return f"[{ipaddress.IPv6Address(inside).compressed}]", rest[1:]
        except ValueError as exc:
            raise _bad_url(url, f"'{inside}' is not an IPv6 address") from exc
    host, _, port_text = netloc.partition(":")
    if ":" in port_text:
        raise _bad_url(url, "an IPv6 address must be written in brackets, e.g. http://[::1]:8091")
    host = host.removesuffix(".")
    if host.isascii():
        host = host.lower()
    else:
        import idna  # requests' own IDNA mapping (UTS 46), so we name the host it will connect to

        try:
            host = idna.encode(host, uts46=True).decode("ascii")
        except idna.IDNAError as exc:
            raise _bad_url(url, f"host '{host}' is not a valid internationalised name") from exc
    numeric = numeric_ipv4(host)         # "127.1", "0x7f.1": an address the resolver reads there
    if numeric is not None and numeric != host:
        raise _bad_url(url, f"'{host}' is not a valid IPv4 address as written: the resolver would read it as "
                       f"{numeric}, so it would name that address under another spelling; write {numeric}")
    if host and all(label.isdigit() for label in host.split(".")):
        try:
            return str(ipaddress.IPv4Address(host)), port_text
        except ValueError as exc:
            raise _bad_url(url, f"'{host}' is not a valid IPv4 address") from exc
    if len(host) > HOST_MAX or not _HOSTNAME.fullmatch(host):
        raise _bad_url(url, f"'{host}' is not a valid host name" if host else "it has no host")
    return host, port_text


def _bad_url(url: object, why: str) -> LauncherError:
    """A workflow's url widget, refused: shown password-masked, without escapes or invisible
    characters, and cut; one longer than URL_SCAN only by its length (no server's URL is that
    long, so such a text is not worth quoting)."""
    text = str(url)
    subject = (f"'{untrusted_text(mask_url_password(text), URL_SHOWN)}'" if len(text) <= URL_SCAN
               else f"A URL of {len(text)} characters")
    return LauncherError(f"{subject} is not a usable server URL", why,
                         "write the server's origin like http://gpu-box:8091 or https://[::1]:8443",
                         setting="url", kind="config")


def key_setup_hint(url: str) -> str:
    """How to give `url`'s server a key, for 401 messages: names the origin to configure."""
    try:
        where = origin(url)
    except LauncherError:
        where = "http://HOST:PORT"
    path = config_file_path()
    return (f"name that server in the launcher config: \"remote_servers\": {{\"my-server\": {{\"url\": \"{where}\", "
            f"\"api_key\": \"...\"}}}} in {path}, or set {REMOTE_URL_VAR}={where} and {REMOTE_KEY_VAR}; "
            "keys never come from workflow widgets")
