"""A /v1/videos server on a fake clock, for the tests of when the client polls (client/poll_window.py).

The server is our own on 127.0.0.1 and runs on a fake clock that the client's sleeps advance, so a
20 s job takes a moment: every status request is a real HTTP exchange, stamped with the fake time
it arrived at, and the job completes when the fake clock reaches its end. `clocked` is the fixture
(import it into the test module): `clocked(durations)` gives a server whose POSTs start those jobs
and a VideoClient on the same fake clock; the learned job times are forgotten afterwards.
"""
from __future__ import annotations

import io
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Optional

import av
import numpy as np
import pytest

from vllm_omni_launcher.client import poll_window
from vllm_omni_launcher.client.api import VideoClient, VideoRequest

NORMAL_S = 0.25


class FakeTime:
    """The one clock of client and server: sleeping advances it."""

    def __init__(self) -> None:
        self.now = 0.0
        self._lock = threading.Lock()

    def clock(self) -> float:
        with self._lock:
            return self.now

    def sleep(self, seconds: float) -> None:
        with self._lock:
            self.now += seconds


def tiny_mp4() -> bytes:
    buf = io.BytesIO()
    with av.open(buf, "w", format="mp4") as out:
        stream = out.add_stream("libx264", rate=16)
        stream.width, stream.height, stream.pix_fmt = 64, 64, "yuv420p"
        for _ in range(5):
            for packet in stream.encode(av.VideoFrame.from_ndarray(np.zeros((64, 64, 3), np.uint8), format="rgb24")):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return buf.getvalue()


@dataclass
class Job:
    start: float
    duration: float
    polls: list[float] = field(default_factory=list)     # fake time of every status request
    seen_done_at: Optional[float] = None                  # the first status request that answered completed

    @property
    def end(self) -> float:
        return self.start + self.duration


class ClockedServer:
    """/v1/videos on the fake clock: each POST starts the next job of `durations`, running at once."""

    def __init__(self, time: FakeTime, durations: list[float]) -> None:
        self.time, self.durations, self.jobs = time, list(durations), []
        video = tiny_mp4()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, code: int, body: Any, ctype: str = "application/json") -> None:
                data = body if isinstance(body, bytes) else json.dumps(body).encode()
                head = f"HTTP/1.1 {code} OK\r\nContent-Type: {ctype}\r\nContent-Length: {len(data)}\r\n\r\n"
                self.wfile.write(head.encode() + data)      # one write: no delayed-ACK wait per poll

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                server.jobs.append(Job(server.time.clock(), server.durations.pop(0)))
                self._send(200, {"id": f"job{len(server.jobs) - 1}", "object": "video", "status": "queued"})

            def do_GET(self) -> None:
                job = server.jobs[int(self.path.split("/")[3].removeprefix("job"))]
                if self.path.endswith("/content"):
                    self._send(200, video, "video/mp4")
                    return
                now = server.time.clock()
                job.polls.append(now)
                done = now >= job.end
                if done and job.seen_done_at is None:
                    job.seen_done_at = now
                self._send(200, {"id": self.path.split("/")[3], "object": "video",
                                 "status": "completed" if done else "in_progress"})

            def do_DELETE(self) -> None:
                self._send(200, {"deleted": True})

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, args=(0.02,), daemon=True).start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture
def clocked():
    servers: list[ClockedServer] = []

    def start(durations: list[float]) -> tuple[ClockedServer, VideoClient]:
        time = FakeTime()
        server = ClockedServer(time, durations)
        servers.append(server)
        return server, VideoClient(server.url, sleep=time.sleep, clock=time.clock)
    yield start
    for server in servers:
        server.close()
    poll_window.LEARNED.clear()


REQUEST = VideoRequest("a cat", width=64, height=64, num_frames=5, fps=16, steps=4)


def polls_between(job: Job, lo: float, hi: float) -> int:
    return sum(1 for t in job.polls if job.start + lo <= t < job.start + hi)
