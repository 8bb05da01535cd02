"""A vLLM-Omni-like job API on the hostile server (hostile_server.py): the routes a VideoClient walks
(submit, status, content, delete), a file served like upstream's FileResponse, and a Cancel pressed
while the client is blocked in a read."""
from __future__ import annotations

import threading
import time
from typing import Any, Callable, Optional

import hostile_server as hs

JOB = "video_gen_1"
CONTENT_PATH = "/v1/videos/v1/content"   # where a test serves file_route alone


def job_body(job_id: str = JOB, status: str = "completed", **extra: Any) -> dict:
    return {"id": job_id, "object": "video", "status": status, "progress": 100 if status == "completed" else 0,
            "error": None, "completed_at": None, **extra}


def job_routes(content: hs.Route, job_id: str = JOB, segment: Optional[str] = None,
               status: Optional[hs.Route] = None) -> dict:
    """A job that completes at once and serves `content`; `segment` is the id as it must appear
    in the path (URL-quoted)."""
    path = f"/v1/videos/{segment or job_id}"
    return {("POST", "/v1/videos"): hs.answer(200, job_body(job_id, "queued")),
            ("GET", path): status or hs.answer(200, job_body(job_id)),
            ("GET", path + "/content"): content,
            ("DELETE", path): hs.answer(200, {"id": job_id, "deleted": True})}


def file_route(data: bytes, *, ranges: bool = True, tail_data: Optional[bytes] = None,
               hold: Optional[Callable[[], object]] = None, cut_at: Optional[int] = None) -> hs.Route:
    """GET of a file like Starlette's FileResponse: `Accept-Ranges: bytes`, and a suffix range
    answered with 206 (from `tail_data` when given: a server whose two answers disagree). The
    whole answer stalls before its last quarter until `hold()` returns when given (so a decoder
    has to wait for it; a test's hold waits for what the test is about, not for a fixed time a
    busy box might not keep to), and stops at `cut_at` when given."""
    def route(peer: hs.Peer) -> None:
        wanted = peer.exchange.headers.get("range", "")
        if ranges and wanted.startswith("bytes=-"):
            start = max(0, len(data) - int(wanted[len("bytes=-"):]))
            body = (tail_data or data)[start:]
            if peer.head(206, {"Content-Type": "video/mp4", "Content-Length": len(body), "Accept-Ranges": "bytes",
                               "Content-Range": f"bytes {start}-{len(data) - 1}/{len(data)}"}):
                peer.send(body)
            return
        headers: dict[str, Any] = {"Content-Type": "video/mp4", "Content-Length": len(data)}
        if ranges:
            headers["Accept-Ranges"] = "bytes"
        if not peer.head(200, headers):
            return
        body = data if cut_at is None else data[:cut_at]
        split = len(body) * 3 // 4
        if peer.send(body[:split]):
            if hold is not None:
                hold()
            peer.send(body[split:])
    return route


class CancelOnceBlocked:
    """Wraps a dripping route: Cancel is pressed `after_s` after the client's (first) request
    reached it, so the client is blocked in that read (however long the requests before it took
    on a busy box). Called, it is the client's should_cancel; `at` is when Cancel was pressed."""

    def __init__(self, route: hs.Route, after_s: float = 1.0) -> None:
        self.route, self.after_s = route, after_s
        self.at: Optional[float] = None
        self._pressed = threading.Event()

    def __call__(self) -> bool:
        return self._pressed.is_set()

    def serve(self, peer: hs.Peer) -> None:
        threading.Timer(self.after_s, self._press).start()
        self.route(peer)

    def _press(self) -> None:
        if self.at is None:
            self.at = time.monotonic()
        self._pressed.set()
