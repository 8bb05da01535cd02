"""A hostile HTTP peer of our own on 127.0.0.1: it answers byte by byte as a script says.

Unlike the canned server in test_client_http.py (well-formed answers), each route here is a
function that writes raw bytes to the socket, so it can trickle a status line one byte every
2 s, announce 800 MiB and stream zeros lazily (nothing that large is ever held), or serve a
decode bomb. The server records every request with its raw (undecoded) path, and for every
answer how many bytes it got out and whether the client hung up on it, so tests can check
that the client stopped reading and closed the connection.
"""
from __future__ import annotations

import json
import socket
import socketserver
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Union


@dataclass
class Exchange:
    """One request and what the route managed to send back."""

    method: str
    path: str                      # raw request target, percent-escapes as sent
    headers: dict[str, str]
    body: bytes
    sent: int = 0                  # answer bytes the socket accepted
    hung_up: bool = False          # the client closed the connection while we were sending
    finished: threading.Event = field(default_factory=threading.Event)


class Peer:
    """The route's handle on its connection."""

    def __init__(self, sock: socket.socket, exchange: Exchange) -> None:
        self.sock, self.exchange = sock, exchange

    def send(self, data: bytes) -> bool:
        """Write data; False once the client has gone (then the route should return)."""
        try:
            self.sock.sendall(data)
        except OSError:
            self.exchange.hung_up = True
            return False
        self.exchange.sent += len(data)
        return True

    def head(self, status: int, headers: dict[str, Union[str, int]]) -> bool:
        lines = [f"HTTP/1.1 {status} X"] + [f"{k}: {v}" for k, v in headers.items()] + ["Connection: close", "", ""]
        return self.send("\r\n".join(lines).encode())


Route = Callable[[Peer], None]


def answer(status: int, payload: Any, content_type: str = "") -> Route:
    """A complete, well-formed answer (JSON for dicts, raw bytes otherwise)."""
    data = json.dumps(payload).encode() if isinstance(payload, (dict, list)) else payload
    ctype = content_type or ("application/json" if isinstance(payload, (dict, list)) else "video/mp4")

    def route(peer: Peer) -> None:
        if peer.head(status, {"Content-Type": ctype, "Content-Length": len(data)}):
            peer.send(data)
    return route


def drip(prefix: bytes = b"", every_s: float = 2.0, byte: bytes = b"H") -> Route:
    """Send `prefix` at once, then one byte every `every_s` seconds until the client hangs up."""
    def route(peer: Peer) -> None:
        if prefix and not peer.send(prefix):
            return
        while peer.send(byte):
            time.sleep(every_s)
    return route


def drip_status_line(every_s: float = 2.0) -> Route:
    """A status line and headers that never finish: 'HTTP/1.1 200 OK...' one byte at a time."""
    text = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n" + b"X-Pad: " + b"a" * 10_000

    def route(peer: Peer) -> None:
        for i in range(len(text)):
            if not peer.send(text[i:i + 1]):
                return
            time.sleep(every_s)
    return route


def zeros(total: int, *, announce: bool = True, chunk: int = 64 << 10) -> Route:
    """A `total`-byte body of zeros, generated chunk by chunk (never held whole); Content-Length
    announced or not (then the body ends when the connection closes)."""
    block = bytes(chunk)

    def route(peer: Peer) -> None:
        headers: dict[str, Union[str, int]] = {"Content-Type": "video/mp4"}
        if announce:
            headers["Content-Length"] = total
        if not peer.head(200, headers):
            return
        left = total
        while left > 0 and peer.send(block[:min(chunk, left)]):
            left -= chunk
    return route


class HostileServer:
    """routes[(METHOD, raw path)] -> Route; unknown routes get a JSON 404."""

    def __init__(self, routes: dict[tuple[str, str], Route], port: int = 0) -> None:
        self.routes = dict(routes)
        self.log: list[Exchange] = []
        server = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                line = self.rfile.readline(65537).decode("latin-1").rstrip("\r\n")
                if not line:
                    return
                method, target = line.split(" ")[:2]
                headers: dict[str, str] = {}
                while True:
                    raw = self.rfile.readline(65537).decode("latin-1").rstrip("\r\n")
                    if not raw:
                        break
                    name, _, value = raw.partition(":")
                    headers[name.strip().lower()] = value.strip()
                body = self.rfile.read(int(headers.get("content-length") or 0))
                exchange = Exchange(method, target, headers, body)
                server.log.append(exchange)
                route = server.routes.get((method, target)) or answer(404, {"error": {"message": "Not Found"}})
                try:
                    route(Peer(self.connection, exchange))
                finally:
                    exchange.finished.set()

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True

            def handle_error(self, request: Any, client_address: Any) -> None:
                pass  # a client that hangs up mid-answer is the point of these tests

        self._server = Server(("127.0.0.1", port), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True)
        self._thread.start()

    def calls(self, method: str, path: Optional[str] = None) -> list[Exchange]:
        return [e for e in self.log if e.method == method and (path is None or e.path == path)]

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
