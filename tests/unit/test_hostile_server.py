"""VideoClient against a hostile server of our own on 127.0.0.1 (hostile_server.py, not the stub).

The server is untrusted: it may serve decode bombs or clips of the wrong shape, announce or
stream bodies far larger than any real clip, trickle its answer one byte every 2 s, hand out
job ids that try to leave their path segment, or put terminal escapes into error text. Each
test checks the message the user sees and that nothing leaked (no worker thread left, the
connection closed) or was allocated (tracemalloc peak: numpy and our buffers are traced).
"""
from __future__ import annotations

import threading
import time
import tracemalloc
from typing import Any, Callable

import pytest

import hostile_server as hs
from cancel_latency import CANCEL_LATENCY_S
from clips import solid_clip
from hostile_jobs import JOB, CancelOnceBlocked, job_body, job_routes
from vllm_omni_launcher.client.abortable import WORKER_NAME
from vllm_omni_launcher.client.api import Deadlines, RetryPolicy, VideoClient, VideoRequest
from vllm_omni_launcher.client.job_results import GenerationCancelled
from vllm_omni_launcher.errors import LauncherError

ESCAPES = ("\x1b", "\x07", "\x08", "\x9b", "\r")


@pytest.fixture(scope="module")
def bomb_4096() -> bytes:
    data = solid_clip(4096, 4096, 60)
    assert len(data) < 100_000   # ~52 KB that would decode to 11 GiB of float32
    return data


def workers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == WORKER_NAME and t.is_alive()]


def assert_nothing_left(server: hs.HostileServer, path: str) -> None:
    """No HTTP worker thread is left, and the client hung up on the route at `path` (the
    route only notices at its next write, so it gets a few seconds). A leaked worker would stay
    blocked on the drip for hours, so waiting long for a slow box to end a stopped one is safe."""
    end = time.monotonic() + 10.0
    while workers() and time.monotonic() < end:
        time.sleep(0.05)
    assert workers() == []
    exchange = server.calls("GET", path)[-1]
    assert exchange.finished.wait(10.0) and exchange.hung_up


def traced_peak(fn: Callable[[], Any]) -> tuple[BaseException, int]:
    """Run fn, which must raise; return the exception and the traced peak allocation."""
    tracemalloc.start()
    try:
        with pytest.raises(BaseException) as info:
            fn()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return info.value, peak


# ----------------------------------------------------------------------------- untrusted MP4

def test_decode_bomb_is_refused_before_its_frames_are_allocated(hostile, bomb_4096):
    server = hostile(job_routes(hs.answer(200, bomb_4096)))
    client = VideoClient(server.url)
    err, peak = traced_peak(lambda: client.generate(VideoRequest("x", width=256, height=256, num_frames=9)))
    assert isinstance(err, LauncherError) and not isinstance(err, MemoryError)
    assert "got 4096x4096x60, asked for 256x256x9" in err.what
    assert "not vLLM-Omni" in err.why and "before decoding" in err.why and err.setting == "server"
    assert peak < 32 << 20, f"peak {peak / 1e6:.1f} MB; the decoded bomb would be 12 GB"
    assert len(server.calls("DELETE", f"/v1/videos/{JOB}")) == 1   # the job is still cleaned up


def test_clip_larger_than_the_request_is_refused(hostile):
    server = hostile(job_routes(hs.answer(200, solid_clip(2048, 2048, 60))))
    client = VideoClient(server.url)
    err, peak = traced_peak(lambda: client.generate(VideoRequest("x", width=1280, height=704, num_frames=9)))
    assert isinstance(err, LauncherError)
    assert "got 2048x2048x60, asked for 1280x704x9" in err.what
    assert peak < 32 << 20   # 9 frames of 1280x704 float32 would already be 97 MB


def test_clip_with_more_frames_than_asked_is_refused(hostile):
    server = hostile(job_routes(hs.answer(200, solid_clip(64, 64, 40))))
    with pytest.raises(LauncherError) as info:
        VideoClient(server.url).generate(VideoRequest("x", width=64, height=64, num_frames=9))
    assert "got 64x64x40, asked for 64x64x9" in info.value.what


def test_clip_of_the_floored_size_and_rounded_frames_is_accepted(hostile):
    # T2V floors 250x130 to 240x128 and rounds 10 frames to 9: what upstream legitimately changes.
    server = hostile(job_routes(hs.answer(200, solid_clip(240, 128, 9))))
    result = VideoClient(server.url).generate(VideoRequest("x", width=250, height=130, num_frames=10))
    assert result.video.frames.shape == (9, 128, 240, 3)


# ----------------------------------------------------------------------------- download cap

def test_huge_announced_body_is_refused_before_reading(hostile):
    server = hostile(job_routes(hs.zeros(800 << 20, announce=True)))
    client = VideoClient(server.url)
    err, peak = traced_peak(lambda: client.generate(VideoRequest("x", width=256, height=256, num_frames=9)))
    assert isinstance(err, LauncherError)
    assert "announced 800.0 MiB" in err.what and "cap of 2.1 MiB" in err.what
    assert "256x256x9" in err.why and "refused it before reading" in err.why and "not vLLM-Omni" in err.why
    assert peak < 8 << 20
    assert_nothing_left(server, f"/v1/videos/{JOB}/content")
    assert server.calls("GET", f"/v1/videos/{JOB}/content")[-1].sent < 64 << 20   # socket buffers at most


def test_huge_unannounced_body_stops_at_the_cap(hostile):
    server = hostile(job_routes(hs.zeros(800 << 20, announce=False)))
    client = VideoClient(server.url)
    err, peak = traced_peak(lambda: client.generate(VideoRequest("x", width=256, height=256, num_frames=9)))
    assert isinstance(err, LauncherError)
    assert "sent more than 2.1 MiB" in err.what and "stopped reading at the cap" in err.why
    assert peak < 8 << 20   # never more than the cap (2.1 MiB) plus one read
    assert_nothing_left(server, f"/v1/videos/{JOB}/content")
    assert server.calls("GET", f"/v1/videos/{JOB}/content")[-1].sent < 64 << 20
    assert len(server.calls("GET", f"/v1/videos/{JOB}/content")) == 1   # an oversize answer is not retried


# ----------------------------------------------------------------------------- deadlines and cancel

def test_dripping_headers_fail_at_the_first_byte_deadline_naming_the_key(hostile):
    server = hostile({("GET", "/v1/models"): hs.drip_status_line(every_s=2.0)})
    first_byte_s = 3.0
    client = VideoClient(server.url, deadlines=Deadlines(first_byte_s=first_byte_s), retry=RetryPolicy(tries=1))
    start = time.monotonic()
    with pytest.raises(LauncherError) as info:
        client.models()
    err = info.value
    # the drip alone would go on for hours: the deadline ends it, noticed as promptly as a cancel
    assert time.monotonic() - start < first_byte_s + CANCEL_LATENCY_S
    assert "no complete answer within 3 s" in err.what and err.kind == "timeout"
    assert err.setting == "first_byte_timeout_s" and "first_byte_timeout_s" in err.fix
    assert "vllm_omni_launcher.json" in err.fix
    assert_nothing_left(server, "/v1/models")


def test_first_byte_deadline_is_retried_for_reads(hostile):
    server = hostile({("GET", "/v1/models"): hs.drip_status_line(every_s=2.0)})
    client = VideoClient(server.url, deadlines=Deadlines(first_byte_s=1.0), retry=RetryPolicy(tries=2, base_s=0.1))
    with pytest.raises(LauncherError) as info:
        client.models()
    assert "(after 2 tries)" in info.value.what and len(server.calls("GET", "/v1/models")) == 2


def test_dripping_body_fails_at_the_body_deadline_naming_the_key(hostile):
    head = b"HTTP/1.1 200 OK\r\nContent-Type: video/mp4\r\nContent-Length: 100000\r\n\r\n"
    server = hostile({("GET", f"/v1/videos/{JOB}/content"): hs.drip(head, every_s=2.0)})
    client = VideoClient(server.url, deadlines=Deadlines(first_byte_s=30.0, body_s=3.0))
    with pytest.raises(LauncherError) as info:
        client.download(JOB)
    err = info.value
    assert "did not finish within 3 s" in err.what and err.setting == "body_timeout_s"
    assert "body_timeout_s" in err.fix
    assert len(server.calls("GET", f"/v1/videos/{JOB}/content")) == 1   # a slow body is not fetched again
    assert_nothing_left(server, f"/v1/videos/{JOB}/content")


def test_cancel_ends_a_blocked_header_read_within_a_second(hostile):
    cancel = CancelOnceBlocked(hs.drip_status_line(every_s=2.0))
    server = hostile(job_routes(hs.answer(200, b""), status=cancel.serve))
    client = VideoClient(server.url)   # default deadlines: 30 s for the first byte
    with pytest.raises(GenerationCancelled) as info:
        client.generate(VideoRequest("x", width=64, height=64, num_frames=9), should_cancel=cancel)
    assert cancel.at is not None and time.monotonic() - cancel.at < CANCEL_LATENCY_S
    assert info.value.job_id == JOB and info.value.deleted
    assert len(server.calls("DELETE", f"/v1/videos/{JOB}")) == 1
    assert_nothing_left(server, f"/v1/videos/{JOB}")


def test_cancel_ends_a_blocked_download_within_a_second(hostile):
    head = b"HTTP/1.1 200 OK\r\nContent-Type: video/mp4\r\nContent-Length: 100000\r\n\r\n"
    cancel = CancelOnceBlocked(hs.drip(head, every_s=2.0))
    server = hostile(job_routes(cancel.serve))
    client = VideoClient(server.url)   # default deadlines: 600 s for the body
    with pytest.raises(GenerationCancelled) as info:
        client.generate(VideoRequest("x", width=64, height=64, num_frames=9), should_cancel=cancel)
    assert cancel.at is not None and time.monotonic() - cancel.at < CANCEL_LATENCY_S
    assert info.value.job_id == JOB
    assert_nothing_left(server, f"/v1/videos/{JOB}/content")


# ----------------------------------------------------------------------------- server-provided strings

def test_job_id_stays_one_path_segment(hostile):
    job_id, segment = "../x?y", "..%2Fx%3Fy"
    server = hostile(job_routes(hs.answer(200, solid_clip(64, 64, 9)), job_id=job_id, segment=segment))
    result = VideoClient(server.url).generate(VideoRequest("x", width=64, height=64, num_frames=9))
    assert result.job_id == job_id and result.video.frames.shape == (9, 64, 64, 3)
    assert [(e.method, e.path) for e in server.log] == [
        ("POST", "/v1/videos"), ("GET", f"/v1/videos/{segment}"), ("GET", f"/v1/videos/{segment}/content"),
        ("DELETE", f"/v1/videos/{segment}")]


def test_dot_job_ids_are_refused_instead_of_resolved_as_dot_segments(hostile):
    server = hostile({("POST", "/v1/videos"): hs.answer(200, job_body("..", "queued"))})
    with pytest.raises(LauncherError) as info:
        VideoClient(server.url).generate(VideoRequest("x", width=64, height=64, num_frames=9))
    assert "unusable job id '..'" in info.value.what and "not vLLM-Omni" in info.value.why
    assert [(e.method, e.path) for e in server.log] == [("POST", "/v1/videos")]   # nothing sent to /v1/


def test_control_characters_from_the_server_never_reach_error_text(hostile):
    job_id = "video\x1b]0;owned\x07_gen"
    message = "\x1b[31mboom\x1b[0m\r\x08 in the \x9b2Jdecoder"
    failed = job_body(job_id, "failed", error={"code": 500, "message": message})
    server = hostile({("POST", "/v1/videos"): hs.answer(200, job_body(job_id, "queued")),
                      ("GET", "/v1/videos/video%1B%5D0%3Bowned%07_gen"): hs.answer(500, failed),
                      ("DELETE", "/v1/videos/video%1B%5D0%3Bowned%07_gen"): hs.answer(200, {"deleted": True})})
    with pytest.raises(LauncherError) as info:
        VideoClient(server.url).generate(VideoRequest("x", width=64, height=64, num_frames=9))
    text = str(info.value)
    assert "boom" in text and "decoder" in text and "video_gen" in text
    assert not any(ch in text for ch in ESCAPES), repr(text)


def test_control_characters_are_stripped_from_http_error_bodies(hostile):
    body = {"error": {"message": "bad \x1b[2J\x1b[Hvalue\x07", "type": "Bad Request", "param": None, "code": 400}}
    server = hostile({("POST", "/v1/videos"): hs.answer(400, body)})
    with pytest.raises(LauncherError) as info:
        VideoClient(server.url).submit(VideoRequest("x"))
    text = str(info.value)
    assert "bad value" in text and not any(ch in text for ch in ESCAPES), repr(text)


def test_probe_of_a_dripping_server_gives_up_at_its_timeout(hostile):
    from vllm_omni_launcher.server.process import probe

    server = hostile({("GET", "/health"): hs.drip_status_line(every_s=2.0)})
    timeout_s, start = 1.0, time.monotonic()
    assert probe.health("127.0.0.1", int(server.url.rsplit(":", 1)[1]), timeout=timeout_s) is None
    assert time.monotonic() - start < timeout_s + CANCEL_LATENCY_S   # the drip alone would go on for hours
    assert_nothing_left(server, "/health")
