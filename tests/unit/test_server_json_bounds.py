"""A server's JSON is parsed within bounds (client/server_json.py, through http_errors.parse_body, the one
place server JSON is parsed): deeply nested or huge answers get the launcher's message, never a raw
RecursionError. Server: our own hostile one on 127.0.0.1 (hostile_server.py)."""
from __future__ import annotations

import json

import pytest

import hostile_server as hs
from clips import solid_clip
from hostile_jobs import JOB, job_body, job_routes
from vllm_omni_launcher.client import server_json
from vllm_omni_launcher.client.api import VideoClient, VideoRequest
from vllm_omni_launcher.client.http_errors import parse_body
from vllm_omni_launcher.errors import LauncherError

DEEP = b"[" * 500_000 + b"]" * 500_000       # 1 MB less a little: within the transport's cap on a JSON body


def test_the_raw_parser_cannot_take_what_a_hostile_server_sends():
    with pytest.raises(RecursionError):       # what parse_body met before the bound
        json.loads(DEEP)


def test_a_deeply_nested_job_status_gets_the_launchers_message(hostile):
    status = hs.answer(200, DEEP, content_type="application/json")
    server = hostile(job_routes(hs.answer(200, solid_clip(64, 64, 9)), status=status))
    with pytest.raises(LauncherError) as info:
        VideoClient(server.url).generate(VideoRequest("x", width=64, height=64, num_frames=9))
    err = info.value
    assert not isinstance(err, RecursionError)
    assert err.what == "The server's answer is not one the launcher reads"
    assert "nested 500000 levels deep (at most 64 are read)" in err.why and "not vLLM-Omni" in err.why
    assert err.setting == "server"
    assert len(server.calls("DELETE", f"/v1/videos/{JOB}")) == 1     # the job is still cleaned up


def test_a_deeply_nested_model_list_gets_the_launchers_message(hostile):
    server = hostile({("GET", "/v1/models"): hs.answer(200, b'{"data": ' + DEEP + b"}", "application/json")})
    with pytest.raises(LauncherError, match="not one the launcher reads"):
        VideoClient(server.url).models()


def test_an_answer_longer_than_the_bound_is_refused_before_parsing():
    text = json.dumps({"id": "x" * server_json.MAX_JSON_CHARS})
    with pytest.raises(LauncherError) as info:
        parse_body(text)
    assert f"it is {len(text)} characters long (at most {server_json.MAX_JSON_CHARS} are read)" in info.value.why


def test_brackets_inside_strings_do_not_count_as_nesting():
    text = json.dumps({"id": JOB, "error": {"message": "[" * 10_000 + "{" * 10_000}})
    assert parse_body(text)["error"]["message"].startswith("[[[")


def test_real_answers_still_parse_and_text_that_is_not_json_is_still_none():
    body = job_body(JOB, stage_durations={"a": [1, 2], "b": {"c": [[1]]}}, metrics=[{"k": [1, {"v": [2]}]}] * 20)
    assert parse_body(json.dumps(body)) == body
    assert parse_body("Internal Server Error") is None and parse_body("") is None
    nested = "[" * server_json.MAX_JSON_DEPTH + "]" * server_json.MAX_JSON_DEPTH
    assert parse_body(nested) is not None     # the bound itself is still read
