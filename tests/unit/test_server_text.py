"""Text a hostile server sends reaches the UI without invisible or reordering characters, and capped.

Zero-width and bidi characters (Unicode Cf: U+200B-U+200F, U+202A-U+202E, U+2066-U+2069, U+FEFF...)
can hide or reorder what a user reads in an error ("Trojan Source"), and an error body is up to
64 KiB: both are dealt with in one place (errors/redact.py: strip_control, untrusted_text), which
every server-provided string in the client's errors goes through. The server here is a hostile peer
on 127.0.0.1 (hostile_server.py) answering with such text.
"""
from __future__ import annotations

import sys
import unicodedata

import pytest

from hostile_server import answer
from vllm_omni_launcher.client.api import VideoClient, VideoRequest
from vllm_omni_launcher.client.http_errors import MESSAGE_LIMIT
from vllm_omni_launcher.errors import LauncherError
from vllm_omni_launcher.errors.redact import SERVER_TEXT_LIMIT, strip_control, untrusted_text

EVERY_CF = "".join(chr(c) for c in range(sys.maxunicode + 1) if unicodedata.category(chr(c)) == "Cf")
HIDING = "\u200b\u200c\u200d\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\ufeff\u2060\u00ad"
# Bidi overrides reorder "flow_shift" so a reader sees another name; zero-width characters hide inside it.
SPOOF = "flow\u200b_sh\u2067ift\u2069\u202e gnirts\u202c\ufeff"


def invisible(text: str) -> list[str]:
    return sorted({f"U+{ord(ch):04X}" for ch in text if unicodedata.category(ch) in ("Cf", "Cs")})


def test_every_format_character_is_removed_and_visible_text_kept() -> None:
    assert strip_control(f"a{EVERY_CF}b") == "ab"              # all of Unicode's Cf, not a hand-picked list
    assert strip_control(SPOOF) == "flow_shift gnirts"
    assert strip_control("line\u2028next\u2029end") == "line\nnext\nend"
    assert strip_control("ünïcödé 视频 █ 👍🏽") == "ünïcödé 视频 █ 👍🏽"


def test_server_text_is_capped_with_a_note_of_what_was_cut() -> None:
    shown = untrusted_text("x" * 50_000)
    assert len(shown) < SERVER_TEXT_LIMIT + 60 and shown.endswith("[46000 more characters not shown]")
    assert untrusted_text(HIDING * 1000 + "ok") == "ok"        # counted after stripping


def test_a_hostile_error_body_reaches_the_error_clean_and_capped(hostile) -> None:
    message = f"Value error, {SPOOF} is invalid " + (HIDING + "padding ") * 300     # ~33 KiB as JSON
    srv = hostile({("POST", "/v1/videos"): answer(400, {"error": {
        "message": message, "type": "BadRequestError", "param": f"body.{SPOOF}", "code": 400}})})
    with pytest.raises(LauncherError) as info:
        VideoClient(srv.url).submit(VideoRequest("a cat"))
    err = info.value
    for part in (err.what, err.why, err.fix, err.raw, str(err)):
        assert invisible(part) == [], part[:200]
    assert len(err.why) <= MESSAGE_LIMIT + 200 and len(err.raw) <= SERVER_TEXT_LIMIT + 60
    assert len(str(err)) < 2 * SERVER_TEXT_LIMIT
    assert "flow_shift gnirts" in err.why                     # what the server said is still readable


def test_a_hostile_failed_job_and_job_id_are_shown_clean_and_capped(hostile) -> None:
    job_id = "video\u202egen\u200b" + "x" * 5000
    quoted = "/v1/videos/video%E2%80%AEgen%E2%80%8B" + "x" * 5000
    failed = {"id": job_id, "object": "video", "status": "failed", "error": {
        "code": "boom", "message": "CUDA \u2066error\u2069 " + "\u200b!" * 30_000}}
    srv = hostile({("POST", "/v1/videos"): answer(200, {"id": job_id, "status": "queued"}),
                   ("GET", quoted): answer(500, failed),
                   ("DELETE", quoted): answer(200, {"id": job_id, "deleted": True})})
    with pytest.raises(LauncherError) as info:
        VideoClient(srv.url).generate(VideoRequest("a cat", width=64, height=64, num_frames=9))
    err = info.value
    assert invisible(str(err)) == []
    assert "videogen" in err.what and len(err.what) < 400          # the id: stripped, capped
    assert "CUDA error" in err.what and len(str(err)) < 2 * SERVER_TEXT_LIMIT


def test_served_model_names_are_shown_clean(hostile) -> None:
    srv = hostile({("GET", "/v1/models"): answer(200, {"data": [{"id": "Wan\u200b-AI/\u202eWan2.2" + "y" * 500}]})})
    (name,) = VideoClient(srv.url).models()
    assert invisible(name) == [] and name.startswith("Wan-AI/Wan2.2") and len(name) < 200
