"""One job through VideoClient against a canned local HTTP server (tests/helpers/canned_server.py):
polling, a failed job's own body, download + decode + delete, cancel (queued or running), a server that
dies, wedges, is gone or restarted mid-job, the client's timeout, and the download's own errors. Waits
go through a recording sleep, so nothing here waits for real beyond the canned server's answers.
"""
from __future__ import annotations

import socket

import numpy as np
import pytest

from canned_server import DROP, FakeSleep, canned_servers, client_for, err_body, job, mp4
import frame_code
from vllm_omni_launcher.client.api import Deadlines, VideoClient, VideoRequest
from vllm_omni_launcher.client.job_results import GenerationCancelled, JobUpdate
from vllm_omni_launcher.errors import LauncherError

serve_fixture = pytest.fixture(name="serve")(canned_servers)


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
    for word in ("width/height", "frames", "vae_tiling", "offload", "parallel_mode", "--parallel ulysses=2", "auto"):
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

