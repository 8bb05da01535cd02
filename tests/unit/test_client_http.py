"""client/transport.py + http_errors.py against a canned local HTTP server (tests/helpers/canned_server.py):
the retry policy and its backoff, no double submit, the request form, how each HTTP error becomes a
sentence naming the setting to change, health and the supervisor's probes over the same transport.
One job's life through VideoClient is test_client_jobs.py's.
"""
from __future__ import annotations

import logging
import socket

import pytest

from canned_server import (DROP, KEY, Canned, FakeSleep, canned_servers, client_for, err_body, job,
                           multipart_fields)
from vllm_omni_launcher.client.api import Deadlines, RetryPolicy, VideoClient, VideoRequest
from vllm_omni_launcher.client.http_errors import FIELD_SETTINGS
from vllm_omni_launcher.errors import LauncherError

serve_fixture = pytest.fixture(name="serve")(canned_servers)


# ----------------------------------------------------------------------------- backoff policy

def test_backoff_policy_is_bounded_exponential():
    assert RetryPolicy().delays() == [0.5, 1.0, 2.0, 4.0]
    assert RetryPolicy(tries=7).delays() == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    assert RetryPolicy(tries=1).delays() == []


def test_deadlines_come_from_the_local_config_keys():
    from vllm_omni_launcher.server.config.local_config import LocalConfig

    config = LocalConfig(connect_timeout_s=1.5, first_byte_timeout_s=7.0, body_timeout_s=60.0)
    assert Deadlines.from_config(config) == Deadlines(connect_s=1.5, first_byte_s=7.0, body_s=60.0)


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
