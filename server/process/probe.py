"""Tiny HTTP checks against the local server: /health and /v1/models; free ports.

They go through the client's one HTTP layer (client/transport.py), so they have its deadlines
and error handling, with one short try each and never through a proxy (the transport takes none
from the environment, and is given none here): a proxy in front of the server we started would
turn a healthy server into a timeout. A refused
connection (the normal state while vLLM loads, since it serves nothing before the model is
warm) returns at once.
"""
from __future__ import annotations

import errno
import socket
from typing import Optional

from ...client.http_errors import model_ids, parse_body
from ...client.transport import ONE_TRY, Deadlines, Reply, Transport
from ...errors import LauncherError
from .timeouts import JOBS_PROBE_S, PROBE_S


def connect_host(host: str) -> str:
    """Where to connect for a server bound to `host` (a wildcard bind answers on loopback)."""
    return "127.0.0.1" if host in ("", "0.0.0.0", "::", "*") else host


def url_for(host: str, port: int) -> str:
    h = connect_host(host)
    return f"http://[{h}]:{port}" if ":" in h else f"http://{h}:{port}"


def _get(host: str, port: int, path: str, api_key: Optional[str], timeout: float) -> Optional[Reply]:
    """One short GET of our own server, any status; None when nothing answered in time."""
    limits = Deadlines(connect_s=timeout, first_byte_s=timeout, body_s=timeout)
    with Transport(url_for(host, port), api_key, deadlines=limits, retry=ONE_TRY, supervised=True) as http:
        try:
            return http.request("GET", path, what=f"Probing {path}", ok=lambda status: True)
        except LauncherError:
            return None


def health(host: str, port: int, timeout: float = PROBE_S) -> Optional[int]:
    """HTTP status of GET /health, or None when nothing answered."""
    reply = _get(host, port, "/health", None, timeout)
    return reply.status if reply is not None else None


def served_models(host: str, port: int, api_key: Optional[str], timeout: float = PROBE_S) -> Optional[list[str]]:
    """Model ids from GET /v1/models, or None when it did not answer 200 with a list."""
    reply = _get(host, port, "/v1/models", api_key, timeout)
    if reply is None or reply.status != 200:
        return None
    return model_ids(parse_body(reply.text))


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET6 if ":" in connect_host(host) else socket.AF_INET) as sock:
        sock.bind((connect_host(host) if host not in ("0.0.0.0", "::") else host, 0))
        return sock.getsockname()[1]


def port_available(host: str, port: int) -> bool:
    """True when we could bind `port` on `host` now (as the server will, with SO_REUSEADDR)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host or "0.0.0.0", port))
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                return False
            raise
    return True


def video_jobs(host: str, port: int, api_key: Optional[str],
               timeout: float = JOBS_PROBE_S) -> Optional[dict[str, str]]:
    """The server's jobs, id -> status, from GET /v1/videos (the newest 100); None when it did not
    answer 200 with a job list."""
    reply = _get(host, port, "/v1/videos?limit=100", api_key, timeout)
    if reply is None or reply.status != 200:
        return None
    body = parse_body(reply.text)
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(data, list):
        return None
    return {str(job["id"]): str(job.get("status")) for job in data if isinstance(job, dict) and "id" in job}
