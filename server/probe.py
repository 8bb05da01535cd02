"""Tiny HTTP checks against the local server: /health, /v1/models, DELETE; free ports.

Standard library only (http.client), on purpose: `requests` honours HTTP(S)_PROXY from the
environment, and a proxy in front of 127.0.0.1 would turn a healthy server into a timeout.
Each call opens one short connection; a refused connection (the normal state while vLLM
loads, since it serves nothing before the model is warm) returns at once.
"""
from __future__ import annotations

import errno
import http.client
import json
import socket
from typing import Optional


def connect_host(host: str) -> str:
    """Where to connect for a server bound to `host` (a wildcard bind answers on loopback)."""
    return "127.0.0.1" if host in ("", "0.0.0.0", "::", "*") else host


def url_for(host: str, port: int) -> str:
    h = connect_host(host)
    return f"http://[{h}]:{port}" if ":" in h else f"http://{h}:{port}"


def _request(host: str, port: int, method: str, path: str, api_key: Optional[str],
             timeout: float) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection(connect_host(host), port, timeout=timeout)
    try:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        conn.request(method, path, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def health(host: str, port: int, timeout: float = 2.0) -> Optional[int]:
    """HTTP status of GET /health, or None when nothing answered."""
    try:
        return _request(host, port, "GET", "/health", None, timeout)[0]
    except (OSError, http.client.HTTPException):
        return None


def served_models(host: str, port: int, api_key: Optional[str], timeout: float = 2.0) -> Optional[list[str]]:
    """Model ids from GET /v1/models, or None when it did not answer 200 with a list."""
    try:
        status, body = _request(host, port, "GET", "/v1/models", api_key, timeout)
        if status != 200:
            return None
        return [str(m.get("id")) for m in json.loads(body).get("data", [])]
    except (OSError, http.client.HTTPException, ValueError, AttributeError):
        return None


def delete_job(base_url: str, job_id: str, api_key: Optional[str], timeout: float = 10.0) -> Optional[int]:
    """Best-effort DELETE /v1/videos/{id}; returns the HTTP status or None."""
    from urllib.parse import urlsplit

    parts = urlsplit(base_url)
    try:
        return _request(parts.hostname or "127.0.0.1", parts.port or 80, "DELETE", f"/v1/videos/{job_id}",
                        api_key, timeout)[0]
    except (OSError, http.client.HTTPException):
        return None


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
