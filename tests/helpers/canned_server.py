"""A scripted local HTTP server standing in for vLLM-Omni's (faults on purpose), and the client side
the tests of client/ use against it.

`Canned` answers each (method, path) from a script of responses whose bodies copy the shapes of the
0.30 wheel's HTTP layer: vLLM's `{"error": {message, type, param, code}}` (`err_body`), the auth
middleware's `{"error": "Unauthorized"}`, a job record (`job`), an MP4 whose frames say their index
(`mp4`); a response may be DROP (the connection closed unanswered) or late. `FakeSleep` records the
client's waits, so retry tests run at once and assert the backoff schedule itself.
"""
from __future__ import annotations

import email.parser
import email.policy
import io
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Iterator, Optional

import av

import frame_code
from vllm_omni_launcher.client.api import VideoClient

KEY = "sk-test-very-secret-4242"
DROP = "drop"  # scripted response: close the socket without answering


def err_body(message: str, status: int, param: Optional[str] = None, typ: Optional[str] = None) -> dict:
    return {"error": {"message": message, "type": typ or "Bad Request", "param": param, "code": status}}


def job(job_id: str = "video_gen_1", status: str = "queued", **extra: Any) -> dict:
    body = {"model": "Wan-AI/Wan2.2-TI2V-5B-Diffusers", "prompt": "a cat", "id": job_id, "object": "video",
            "status": status, "size": "64x64", "progress": 100 if status == "completed" else 0,
            "seconds": "4", "quality": "default", "completed_at": None, "created_at": 1796006289,
            "remixed_from_video_id": None, "error": None, "media_type": "video/mp4", "expires_at": None,
            "file_name": None, "inference_time_s": None, "fps": 16.0, "num_frames": 9, "duration_s": 0.56,
            "metrics": None, "stage_durations": {}, "peak_memory_mb": 0.0, "action": None}
    body.update(extra)
    return body


def mp4(count: int = 5, w: int = 64, h: int = 64, seed: int = 3) -> bytes:
    buf = io.BytesIO()
    with av.open(buf, "w", format="mp4") as out:
        s = out.add_stream("libx264", rate=16)
        s.width, s.height, s.pix_fmt = w, h, "yuv420p"
        for i in range(count):
            for p in s.encode(av.VideoFrame.from_ndarray(frame_code.encode(i, seed, w, h), format="rgb24")):
                out.mux(p)
        for p in s.encode():
            out.mux(p)
    return buf.getvalue()


class Canned:
    """Scripted server: script[(METHOD, path)] is a list of responses, the last one repeats.

    A response is (status, body) with body dict (JSON) / bytes / str, or DROP, or
    ("slow", seconds, response) to answer late.
    Every request is logged as dict(method, path, headers, body).
    """

    def __init__(self, script: dict, port: int = 0) -> None:
        self.script = {k: list(v) for k, v in script.items()}
        self.log: list[dict] = []
        self.closed = False
        canned = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _serve(self) -> None:
                if canned.closed:  # a dead server answers nothing, even on kept-alive connections
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                path = self.path.split("?")[0]
                canned.log.append({"method": self.command, "path": path, "headers": dict(self.headers),
                                   "body": body})
                steps = canned.script.get((self.command, path)) or [(404, err_body("Not Found", 404, typ="Not Found"))]
                step = steps.pop(0) if len(steps) > 1 else steps[0]
                if isinstance(step, tuple) and step[0] == "slow":
                    time.sleep(step[1])
                    step = step[2]
                if step == DROP:
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                status, payload = step[0], step[1]
                headers = step[2] if len(step) > 2 else {}
                if isinstance(payload, (dict, list)):
                    data, ctype = json.dumps(payload).encode(), "application/json"
                elif isinstance(payload, str):
                    data, ctype = payload.encode(), "text/plain"
                else:
                    data, ctype = payload, "video/mp4"
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", ctype)
                    self.send_header("Content-Length", str(len(data)))
                    for k, v in headers.items():
                        self.send_header(k, v)
                    self.end_headers()
                    self.wfile.write(data)
                except ConnectionError:   # the client hung up first (a timeout under test): not an error to print
                    self.close_connection = True

            do_GET = do_POST = do_DELETE = _serve

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.02,), daemon=True)
        self.thread.start()

    def calls(self, method: str, path: Optional[str] = None) -> list[dict]:
        return [r for r in self.log if r["method"] == method and (path is None or r["path"] == path)]

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.server.shutdown()
        self.server.server_close()


class FakeSleep:
    def __init__(self, hook: Optional[Callable[[float], None]] = None) -> None:
        self.calls: list[float] = []
        self.hook = hook

    def __call__(self, seconds: float) -> None:
        self.calls.append(seconds)
        if self.hook:
            self.hook(seconds)

    @property
    def total(self) -> float:
        return sum(self.calls)


def canned_servers() -> Iterator[Callable[..., "Canned"]]:
    """The `serve` fixture's body: start(script, port=0) starts a Canned server, all closed at the end."""
    servers: list[Canned] = []

    def start(script: dict, port: int = 0) -> Canned:
        s = Canned(script, port)
        servers.append(s)
        return s

    yield start
    for s in servers:
        s.close()


def client_for(server: Canned, key: Optional[str] = None, **kw: Any) -> tuple[VideoClient, FakeSleep]:
    sleep = kw.pop("sleep", None) or FakeSleep()
    return VideoClient(server.url, api_key=key, sleep=sleep, **kw), sleep


def multipart_fields(record: dict) -> dict[str, Any]:
    ctype = record["headers"]["Content-Type"]
    assert ctype.startswith("multipart/form-data")
    msg = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
        b"Content-Type: " + ctype.encode() + b"\r\n\r\n" + record["body"])
    out: dict[str, Any] = {}
    for part in msg.iter_parts():
        name = part.get_param("name", header="content-disposition")
        payload = part.get_payload(decode=True)
        out[name] = payload if part.get_filename() else payload.decode()
    return out

