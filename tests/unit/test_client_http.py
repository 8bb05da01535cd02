"""client/transport.py + http_errors.py + api.py against a canned local HTTP server (faults on purpose).

The server on 127.0.0.1 answers with scripted responses whose bodies copy the shapes
of the 0.30 wheel's HTTP layer: vLLM's
`{"error": {message, type, param, code}}`, the auth middleware's `{"error": "Unauthorized"}`,
and a failed job's own body with HTTP 500. Waits go through an injected sleep that only
records, so retry tests run instantly and assert the backoff schedule itself.
"""
from __future__ import annotations

import email.parser
import email.policy
import io
import json
import logging
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable, Optional

import av
import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "contract"))
import frame_code  # noqa: E402

from vllm_omni_launcher.client.api import Deadlines, RetryPolicy, VideoClient, VideoRequest  # noqa: E402
from vllm_omni_launcher.client.job_results import GenerationCancelled, JobUpdate  # noqa: E402
from vllm_omni_launcher.client.http_errors import FIELD_SETTINGS  # noqa: E402
from vllm_omni_launcher.errors import LauncherError  # noqa: E402

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


@pytest.fixture
def serve():
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


# ----------------------------------------------------------------------------- backoff policy

def test_backoff_policy_is_bounded_exponential():
    assert RetryPolicy().delays() == [0.5, 1.0, 2.0, 4.0]
    assert RetryPolicy(tries=7).delays() == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    assert RetryPolicy(tries=1).delays() == []


def test_deadlines_come_from_the_local_config_keys():
    from vllm_omni_launcher.server.config.local_config import LocalConfig

    config = LocalConfig(connect_timeout_s=1.5, first_byte_timeout_s=7.0, body_timeout_s=60.0)
    assert Deadlines.from_config(config) == Deadlines(connect_s=1.5, first_byte_s=7.0, body_s=60.0)
    assert Deadlines.from_config(LocalConfig()) == Deadlines() == Deadlines(5.0, 30.0, 600.0)


@pytest.mark.parametrize("status", [408, 429, 502, 503, 504])
def test_retriable_status_is_retried_with_backoff_then_succeeds(serve, status):
    srv = serve({("GET", "/v1/models"): [(status, err_body("busy", status, typ="x")),
                                         (status, err_body("busy", status, typ="x")),
                                         (200, {"object": "list", "data": [{"id": "Wan-AI/Wan2.2-TI2V-5B-Diffusers"}]})]})
    client, sleep = client_for(srv)
    assert client.models() == ["Wan-AI/Wan2.2-TI2V-5B-Diffusers"]
    assert len(srv.calls("GET", "/v1/models")) == 3
    assert sleep.total == pytest.approx(0.5 + 1.0)
    assert max(sleep.calls) <= 0.25  # waits are sliced for cancel checks


def test_retries_are_bounded_and_the_error_names_the_status(serve):
    srv = serve({("GET", "/v1/models"): [(503, err_body("Service Unavailable", 503, typ="Service Unavailable"))]})
    client, sleep = client_for(srv)
    with pytest.raises(LauncherError) as info:
        client.models()
    assert len(srv.calls("GET")) == 5
    assert sleep.total == pytest.approx(0.5 + 1 + 2 + 4)
    assert "HTTP 503" in info.value.what and "Service Unavailable" in info.value.raw


@pytest.mark.parametrize("status", [400, 401, 403, 404, 409, 422])
def test_client_errors_are_never_retried(serve, status):
    srv = serve({("GET", "/v1/models"): [(status, err_body("nope", status))]})
    client, sleep = client_for(srv)
    with pytest.raises(LauncherError):
        client.models()
    assert len(srv.calls("GET")) == 1 and sleep.calls == []


def test_honours_retry_after_on_429(serve):
    srv = serve({("GET", "/v1/models"): [(429, err_body("slow down", 429), {"Retry-After": "3"}),
                                         (200, {"data": [{"id": "m"}]})]})
    client, sleep = client_for(srv)
    assert client.models() == ["m"]
    assert sleep.total == pytest.approx(3.0)


def test_connection_refused_is_retried_then_explained_with_the_url():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sleep = FakeSleep()
    client = VideoClient(f"http://127.0.0.1:{port}", sleep=sleep)
    with pytest.raises(LauncherError) as info:
        client.models()
    err = info.value
    assert f"http://127.0.0.1:{port}" in err.what and "refused" in err.why
    assert "not running" in err.why and err.setting == "server"
    assert "Connection refused" in err.raw or "111" in err.raw
    assert sleep.total == pytest.approx(7.5)


# ----------------------------------------------------------------------------- submit: no double submit

def test_submit_is_retried_when_the_connection_was_refused_before_sending(serve):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    started: list[Canned] = []

    def start_server_on_first_wait(_: float) -> None:
        if not started:
            started.append(serve({("POST", "/v1/videos"): [(200, job("video_gen_late"))]}, port=port))

    sleep = FakeSleep(start_server_on_first_wait)
    client = VideoClient(f"http://127.0.0.1:{port}", sleep=sleep)
    assert client.submit(VideoRequest("a cat", num_frames=9)) == "video_gen_late"
    assert len(started[0].calls("POST", "/v1/videos")) == 1


def test_submit_is_not_retried_when_the_connection_dropped_after_sending(serve):
    srv = serve({("POST", "/v1/videos"): [DROP, (200, job())]})
    client, sleep = client_for(srv)
    with pytest.raises(LauncherError) as info:
        client.submit(VideoRequest("a cat", num_frames=9))
    assert len(srv.calls("POST", "/v1/videos")) == 1
    assert "Lost the connection" in info.value.what


@pytest.mark.parametrize("status", [502, 503, 504])
def test_submit_is_not_retried_on_server_errors(serve, status):
    srv = serve({("POST", "/v1/videos"): [(status, err_body("bad gateway", status)), (200, job())]})
    client, _ = client_for(srv)
    with pytest.raises(LauncherError):
        client.submit(VideoRequest("a cat", num_frames=9))
    assert len(srv.calls("POST", "/v1/videos")) == 1


# ----------------------------------------------------------------------------- form

def test_form_is_multipart_without_model_and_always_has_frames_and_fps(serve):
    srv = serve({("POST", "/v1/videos"): [(200, job())]})
    client, _ = client_for(srv)
    png = b"\x89PNG fake"
    req = VideoRequest("a cat", negative_prompt="blurry", width=832, height=480, num_frames=81, fps=16.0,
                       steps=40, guidance=4.0, guidance_2=3.0, boundary_ratio=0.875, flow_shift=12.0,
                       seed=42, image_png=png)
    client.submit(req)
    fields = multipart_fields(srv.calls("POST")[0])
    assert "model" not in fields
    assert fields["num_frames"] == "81" and fields["fps"] == "16"
    assert fields["num_inference_steps"] == "40" and fields["guidance_scale"] == "4.0"
    assert fields["guidance_scale_2"] == "3.0" and fields["boundary_ratio"] == "0.875"
    assert fields["flow_shift"] == "12.0" and fields["seed"] == "42"
    assert fields["width"] == "832" and fields["height"] == "480" and fields["negative_prompt"] == "blurry"
    assert fields["input_reference"] == png


def test_form_omits_none_and_sends_defaults_for_frames_and_fps():
    form = VideoRequest("a cat").form_fields()
    assert form == {"prompt": "a cat", "num_frames": "81", "fps": "16"}


def test_fractional_fps_is_a_float_on_030_and_an_error_naming_fps_on_026():
    assert VideoRequest("x", fps=23.976).form_fields((0, 30))["fps"] == "23.976"
    assert VideoRequest("x", fps=24.0).form_fields((0, 26))["fps"] == "24"
    with pytest.raises(LauncherError) as info:
        VideoRequest("x", fps=23.976).form_fields((0, 26))
    assert info.value.setting == "fps" and "0.26" in info.value.what


def test_form_refuses_model_and_bad_fps_or_frames():
    with pytest.raises(LauncherError):
        VideoRequest("x", extra={"model": "other"}).form_fields()
    with pytest.raises(LauncherError) as info:
        VideoRequest("x", fps=0.5).form_fields()
    assert info.value.setting == "fps"
    with pytest.raises(LauncherError) as info:
        VideoRequest("x", num_frames=0).form_fields()
    assert info.value.setting == "frames"


# ----------------------------------------------------------------------------- error mapping

@pytest.mark.parametrize("field,setting", [
    ("num_inference_steps", "steps"), ("num_frames", "frames"), ("guidance_scale", "guidance"),
    ("guidance_scale_2", "guidance_2"), ("input_reference", "image"), ("fps", "fps"), ("seconds", "seconds"),
])
def test_400_with_param_names_our_setting(serve, field, setting):
    srv = serve({("POST", "/v1/videos"): [(400, err_body(f"bad {field}", 400, param=f"body.{field}"))]})
    client, _ = client_for(srv)
    with pytest.raises(LauncherError) as info:
        client.submit(VideoRequest("a cat"))
    assert info.value.setting == setting == FIELD_SETTINGS[field]
    assert f"bad {field}" in info.value.raw and "HTTP 400" in info.value.raw


def test_pydantic_400_without_param_is_mapped_from_the_message(serve):
    message = ("1 validation error for VideoGenerationRequest\nnum_inference_steps\n  Input should be less than "
               "or equal to 200 [type=less_than_equal, input_value=500, input_type=int]")
    srv = serve({("POST", "/v1/videos"): [(400, err_body(message, 400, typ="BadRequestError"))]})
    client, _ = client_for(srv)
    with pytest.raises(LauncherError) as info:
        client.submit(VideoRequest("a cat", steps=500))
    err = info.value
    assert err.setting == "steps" and "1..200" in err.fix and "less than or equal to 200" in err.raw


def test_model_mismatch_400_is_explained(serve):
    msg = "Model mismatch: request specifies 'X' but server is running 'Y'."
    srv = serve({("POST", "/v1/videos"): [(400, err_body(msg, 400))]})
    client, _ = client_for(srv)
    with pytest.raises(LauncherError) as info:
        client.submit(VideoRequest("a cat"))
    assert info.value.setting == "model" and msg in info.value.raw


def test_401_without_key_says_a_key_is_required_and_where_it_comes_from(serve):
    srv = serve({("POST", "/v1/videos"): [(401, {"error": "Unauthorized"})]})
    client, _ = client_for(srv)
    with pytest.raises(LauncherError) as info:
        client.submit(VideoRequest("a cat"))
    err = info.value
    assert "requires an API key" in err.what
    assert "VLLM_OMNI_LAUNCHER_REMOTE_API_KEY" in err.fix and "never come from workflow widgets" in err.fix
    assert "Unauthorized" in err.raw


def test_401_with_key_says_the_key_is_wrong_and_never_shows_it(serve, caplog):
    caplog.set_level(logging.DEBUG)
    srv = serve({("POST", "/v1/videos"): [(401, {"error": "Unauthorized", "echo": KEY})]})
    client, _ = client_for(srv, key=KEY)
    with pytest.raises(LauncherError) as info:
        client.submit(VideoRequest("a cat"))
    err = info.value
    assert "rejected the API key" in err.what
    assert srv.calls("POST")[0]["headers"]["Authorization"] == f"Bearer {KEY}"
    assert KEY not in str(err) and KEY not in repr(err) and KEY not in err.raw
    assert KEY not in repr(client) and "api_key=set" in repr(client)
    assert KEY not in caplog.text


def test_key_is_sent_on_every_call_and_health_needs_none(serve):
    srv = serve({("GET", "/health"): [(200, {"status": "healthy"})],
                 ("GET", "/v1/models"): [(200, {"data": [{"id": "m"}]})]})
    client, _ = client_for(srv, key=KEY)
    assert client.health() is True and client.models() == ["m"]
    assert all(r["headers"].get("Authorization") == f"Bearer {KEY}" for r in srv.log)
    plain, _ = client_for(srv)
    assert plain.health() is True
    assert "Authorization" not in srv.log[-1]["headers"]


def test_health_is_false_on_503_and_on_refused(serve):
    srv = serve({("GET", "/health"): [(503, {"status": "unhealthy", "reason": "No engine initialized"})]})
    assert client_for(srv)[0].health() is False
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert VideoClient(f"http://127.0.0.1:{port}").health() is False


def test_404_on_a_job_says_the_server_forgot_it(serve):
    srv = serve({("GET", "/v1/videos/video_gen_x"): [(404, err_body("Video not found", 404, typ="Not Found"))]})
    client, _ = client_for(srv)
    with pytest.raises(LauncherError) as info:
        client.status("video_gen_x")
    assert "no longer knows job video_gen_x" in info.value.what and "restarted" in info.value.why


def test_404_on_the_videos_route_says_not_vllm_omni(serve):
    srv = serve({})
    client, _ = client_for(srv)
    with pytest.raises(LauncherError) as info:
        client.submit(VideoRequest("a cat"))
    assert "no such endpoint" in info.value.what and "--omni" in info.value.fix


def test_409_from_several_api_servers_is_explained(serve):
    msg = "Video APIs require a single API server process (--api-server-count=1)."
    srv = serve({("POST", "/v1/videos"): [(409, err_body(msg, 409, typ="Conflict"))]})
    client, _ = client_for(srv)
    with pytest.raises(LauncherError) as info:
        client.submit(VideoRequest("a cat"))
    assert "--api-server-count 1" in info.value.fix and msg in info.value.raw


# ----------------------------------------------------------------------------- status / failed jobs

OOM_MSG = ("CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total capacity of 139.81 GiB of which "
           "1.23 GiB is free.")


def test_failed_job_http_500_body_is_read_as_a_state(serve):
    failed = job(status="failed", error={"code": 500, "message": OOM_MSG})
    srv = serve({("GET", "/v1/videos/video_gen_1"): [(500, failed)]})
    client, sleep = client_for(srv)
    state = client.status("video_gen_1")
    assert state.status == "failed" and state.error == OOM_MSG and state.http_status == 500
    assert state.error_code == 500 and state.raw["id"] == "video_gen_1"
    assert len(srv.log) == 1 and sleep.calls == []


def test_status_retries_gateway_errors(serve):
    srv = serve({("GET", "/v1/videos/video_gen_1"): [(502, "Bad Gateway"), (200, job(status="in_progress"))]})
    client, _ = client_for(srv)
    assert client.status("video_gen_1").status == "in_progress"
    assert len(srv.log) == 2


def _job_script(mp4_bytes: bytes, *, statuses=("queued", "queued", "in_progress", "in_progress", "completed"),
                delete=((200, {"id": "video_gen_1", "deleted": True, "object": "video.deleted"}),)) -> dict:
    polls = [(200, job(status=s, completed_at=1796006300 if s == "completed" else None,
                       file_name="video_gen_1.mp4" if s == "completed" else None)) for s in statuses]
    return {("POST", "/v1/videos"): [(200, job())],
            ("GET", "/v1/videos/video_gen_1"): polls,
            ("GET", "/v1/videos/video_gen_1/content"): [(200, mp4_bytes)],
            ("DELETE", "/v1/videos/video_gen_1"): list(delete)}


def test_generate_polls_downloads_decodes_deletes_and_reports(serve):
    data = mp4(5, 64, 64, seed=3)
    srv = serve(_job_script(data))
    client, sleep = client_for(srv)
    updates: list[JobUpdate] = []
    result = client.generate(VideoRequest("a cat", num_frames=5, seed=3), on_update=updates.append)
    assert result.job_id == "video_gen_1" and result.mp4 == data
    assert result.video.frames.shape == (5, 64, 64, 3)
    assert [frame_code.decode(f) for f in result.video.frames] == [(i, 3) for i in range(5)]
    assert [u.status for u in updates] == ["queued", "queued", "in_progress", "in_progress", "completed"]
    assert all(u.job_id == "video_gen_1" for u in updates)
    assert updates[-1].queued_s >= updates[0].queued_s >= 0 and updates[-1].running_s >= 0
    assert len(srv.calls("DELETE", "/v1/videos/video_gen_1")) == 1
    assert sleep.calls and max(sleep.calls) <= 0.25
    for key in ("submit", "queued", "running", "job_done", "downloaded", "decoded", "detect_delay"):
        assert key in result.timings
    t = result.timings
    assert 0 <= t["submit"] <= t["job_done"] <= t["downloaded"] <= t["decoded"]


def test_generate_never_sleeps_longer_than_the_poll_interval(serve):
    srv = serve(_job_script(mp4()))
    client, sleep = client_for(srv)
    client.generate(VideoRequest("a cat", num_frames=5), poll_interval=0.1)
    assert sleep.calls and max(sleep.calls) <= 0.1


def test_generate_failed_oom_job_explains_and_keeps_the_raw_body(serve):
    script = _job_script(b"", statuses=("queued", "in_progress", "failed"))
    script[("GET", "/v1/videos/video_gen_1")][-1] = (500, job(status="failed",
                                                              error={"code": 500, "message": OOM_MSG}))
    srv = serve(script)
    client, _ = client_for(srv)
    with pytest.raises(LauncherError) as info:
        client.generate(VideoRequest("a cat", num_frames=5))
    err = info.value
    assert "ran out of memory" in err.what and "video_gen_1" in err.what
    for word in ("width/height", "frames", "VAE tiling", "CPU offload", "parallel", "auto"):
        assert word in err.fix
    assert "CUDA out of memory" in err.raw and "HTTP 500" in err.raw
    assert srv.calls("GET", "/v1/videos/video_gen_1/content") == []
    assert len(srv.calls("DELETE")) == 1  # failed job record cleaned up


def test_generate_other_failure_shows_the_server_message(serve):
    msg = "height and width must be divisible by 16 but got height=481 width=832"
    script = _job_script(b"", statuses=("queued", "failed"))
    script[("GET", "/v1/videos/video_gen_1")][-1] = (500, job(status="failed", error={"code": 500, "message": msg}))
    srv = serve(script)
    client, _ = client_for(srv)
    with pytest.raises(LauncherError) as info:
        client.generate(VideoRequest("a cat", num_frames=5))
    assert info.value.setting == "width" and msg in info.value.raw


def test_generate_cancel_deletes_at_once_and_raises_generation_cancelled(serve):
    srv = serve(_job_script(mp4(), statuses=("queued", "in_progress")))
    client, _ = client_for(srv)
    def should_cancel() -> bool:
        return len(srv.calls("GET", "/v1/videos/video_gen_1")) >= 3

    with pytest.raises(GenerationCancelled) as info:
        client.generate(VideoRequest("a cat", num_frames=5), should_cancel=should_cancel)
    err = info.value
    assert err.job_id == "video_gen_1" and err.deleted and err.status == "in_progress"
    assert isinstance(err, LauncherError)
    assert "cannot abort" in err.why and "restart the server" in err.fix
    assert len(srv.calls("DELETE", "/v1/videos/video_gen_1")) == 1
    assert srv.calls("GET", "/v1/videos/video_gen_1/content") == []


def test_cancel_while_queued_says_nothing_ran(serve):
    srv = serve(_job_script(mp4(), statuses=("queued",)))
    client, _ = client_for(srv)
    with pytest.raises(GenerationCancelled) as info:
        client.generate(VideoRequest("a cat"), should_cancel=lambda: len(srv.calls("GET")) >= 1)
    assert info.value.status == "queued" and "never reached the GPU" in info.value.why
    assert len(srv.calls("DELETE")) == 1


def test_delete_retries_cancellation_in_progress_409(serve):
    conflict = (409, err_body("Cancellation in progress. Please try again later.", 409, typ="Conflict"))
    srv = serve({("DELETE", "/v1/videos/video_gen_1"): [conflict, conflict,
                                                        (200, {"id": "video_gen_1", "deleted": True})]})
    client, sleep = client_for(srv)
    assert client.delete("video_gen_1") is True
    assert len(srv.calls("DELETE")) == 3


def test_delete_is_best_effort(serve):
    srv = serve({("DELETE", "/v1/videos/gone"): [(404, err_body("Video not found", 404))],
                 ("DELETE", "/v1/videos/stuck"): [(409, err_body("Cancellation in progress.", 409))]})
    client, _ = client_for(srv)
    assert client.delete("gone") is True
    assert client.delete("stuck") is False
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert VideoClient(f"http://127.0.0.1:{port}", sleep=FakeSleep()).delete("x") is False


def test_server_dying_mid_job_gives_a_clear_error_without_hanging(serve):
    script = _job_script(mp4(), statuses=("queued", "in_progress"))
    script[("GET", "/v1/videos/video_gen_1")] = [(200, job(status="in_progress")), DROP]
    srv = serve(script)
    client, sleep = client_for(srv)
    with pytest.raises(LauncherError) as info:
        client.generate(VideoRequest("a cat"))
    err = info.value
    assert "stopped answering while job video_gen_1 was in progress" in err.what
    assert "connection was cut" in err.why
    # A remote server has no launcher node and no log here: the fix points at its own machine.
    assert "machine that runs the server" in err.fix and "launcher node" not in err.fix and err.raw
    assert len(srv.calls("GET", "/v1/videos/video_gen_1")) == 1 + 5  # one good poll, then 5 bounded tries


def test_server_gone_mid_job_fix_is_the_callers_log_hint(serve):
    script = _job_script(mp4(), statuses=("in_progress",))
    script[("GET", "/v1/videos/video_gen_1")] = [(200, job(status="in_progress")), DROP]
    srv = serve(script)
    client, _ = client_for(srv, log_hint="Server Status shows it")
    with pytest.raises(LauncherError) as info:
        client.generate(VideoRequest("a cat"))
    assert info.value.fix == "Server Status shows it"


def test_server_gone_mid_job_says_the_process_exited(serve):
    srv = serve(_job_script(mp4(), statuses=("in_progress",)))
    calls = {"n": 0}

    def stop_server_after_first_poll(_: float) -> None:
        calls["n"] += 1
        if calls["n"] == 1:
            srv.close()

    client, _ = client_for(srv, sleep=FakeSleep(stop_server_after_first_poll))
    with pytest.raises(LauncherError) as info:
        client.generate(VideoRequest("a cat"))
    err = info.value
    assert "stopped answering while job video_gen_1 was in progress" in err.what
    assert "refuses connections" in err.why and "exited" in err.why


def test_wedged_server_mid_job_is_reported_after_bounded_poll_timeouts(serve):
    script = _job_script(mp4(), statuses=("in_progress",))
    script[("GET", "/v1/videos/video_gen_1")] = [(200, job(status="in_progress")),
                                                 ("slow", 3.0, (200, job(status="in_progress")))]
    srv = serve(script)
    # 1 s, not less: the POST before the polls must answer within it on a loaded CI box
    client, _ = client_for(srv, deadlines=Deadlines(first_byte_s=1.0))
    with pytest.raises(LauncherError) as info:
        client.generate(VideoRequest("a cat"))
    err = info.value
    assert "stopped answering while job video_gen_1 was in progress" in err.what
    assert "wedged" in err.why and "within 1 s" in err.why and "first_byte_timeout_s" in err.why
    assert len(srv.calls("GET", "/v1/videos/video_gen_1")) == 1 + 5


def test_server_restarted_mid_job_says_the_job_was_forgotten(serve):
    script = _job_script(mp4(), statuses=("queued",))
    script[("GET", "/v1/videos/video_gen_1")] = [(200, job()), (404, err_body("Video not found", 404))]
    srv = serve(script)
    client, _ = client_for(srv)
    with pytest.raises(LauncherError) as info:
        client.generate(VideoRequest("a cat"))
    assert "no longer knows job video_gen_1" in info.value.what
    assert srv.calls("DELETE") == []


def test_timeout_deletes_the_job_and_names_the_limit(serve, monkeypatch):
    srv = serve(_job_script(mp4(), statuses=("in_progress",)))
    client, _ = client_for(srv)
    with pytest.raises(LauncherError) as info:
        client.generate(VideoRequest("a cat"), timeout_s=0.0)
    assert "did not finish within 0 s" in info.value.what and info.value.setting == "timeout"
    assert len(srv.calls("DELETE")) == 1


def test_foreign_exception_from_on_update_still_deletes_the_job(serve):
    class Interrupted(Exception):
        pass

    srv = serve(_job_script(mp4(), statuses=("in_progress",)))
    client, _ = client_for(srv)

    def on_update(update: JobUpdate) -> None:
        raise Interrupted()

    with pytest.raises(Interrupted):
        client.generate(VideoRequest("a cat"), on_update=on_update)
    assert len(srv.calls("DELETE")) == 1


def test_cancel_during_backoff_stops_waiting(serve):
    srv = serve({("POST", "/v1/videos"): [(200, job())],
                 ("GET", "/v1/videos/video_gen_1"): [(503, "unavailable")],
                 ("DELETE", "/v1/videos/video_gen_1"): [(200, {"deleted": True})]})
    sleep = FakeSleep()
    client = VideoClient(srv.url, sleep=sleep)
    with pytest.raises(GenerationCancelled):
        client.generate(VideoRequest("a cat"), should_cancel=lambda: len(sleep.calls) >= 2)
    assert len(sleep.calls) == 2  # cancelled inside the first backoff wait
    assert len(srv.calls("DELETE")) == 1


def test_download_streams_the_whole_file(serve):
    data = np.random.default_rng(0).integers(0, 255, 3 * (1 << 20) + 17, dtype=np.uint8).tobytes()
    srv = serve({("GET", "/v1/videos/v/content"): [(200, data)]})
    client, _ = client_for(srv)
    assert client.download("v") == data


def test_download_of_failed_job_422_is_explained(serve):
    srv = serve({("GET", "/v1/videos/v/content"): [
        (422, err_body("Video generation failed. Check job status for error details.", 422,
                       typ="Unprocessable Entity"))]})
    client, _ = client_for(srv)
    with pytest.raises(LauncherError) as info:
        client.download("v")
    assert "no video to download" in info.value.what


def test_loopback_server_ignores_proxy_environment(serve, monkeypatch):
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    srv = serve({("GET", "/v1/models"): [(200, {"data": [{"id": "m"}]})]})
    client, _ = client_for(srv)
    assert client.models() == ["m"]


# ----------------------------------------------------------------------------- server/process/probe.py (same transport)

def test_probe_reports_health_status_and_models_with_the_key(serve, monkeypatch):
    from vllm_omni_launcher.server.process import probe

    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")  # our own server is never reached via a proxy
    srv = serve({("GET", "/health"): [(503, {"status": "unhealthy"}), (200, {"status": "healthy"})],
                 ("GET", "/v1/models"): [(200, {"object": "list", "data": [{"id": "Wan-AI/Wan2.2-TI2V-5B-Diffusers"}]})]})
    port = int(srv.url.rsplit(":", 1)[1])
    assert probe.health("127.0.0.1", port) == 503
    assert probe.health("0.0.0.0", port) == 200          # a wildcard bind is probed on loopback
    assert probe.served_models("127.0.0.1", port, KEY) == ["Wan-AI/Wan2.2-TI2V-5B-Diffusers"]
    assert srv.calls("GET", "/v1/models")[0]["headers"]["Authorization"] == f"Bearer {KEY}"
    assert "Authorization" not in srv.calls("GET", "/health")[0]["headers"]


def test_probe_says_none_when_nothing_answers_or_the_answer_is_not_a_model_list(serve):
    from vllm_omni_launcher.server.process import probe

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    assert probe.health("127.0.0.1", free) is None and probe.served_models("127.0.0.1", free, None) is None
    srv = serve({("GET", "/v1/models"): [(401, {"error": "Unauthorized"}), (200, {"data": "nope"})]})
    port = int(srv.url.rsplit(":", 1)[1])
    assert probe.served_models("127.0.0.1", port, None) is None   # 401
    assert probe.served_models("127.0.0.1", port, None) is None   # not a list
    assert len(srv.calls("GET", "/v1/models")) == 2               # one try each, no retries
