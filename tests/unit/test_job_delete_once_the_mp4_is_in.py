"""A finished job is deleted on the server once its MP4 is in (beside the decode of its last frames, off the
caller's path), exactly once, and `generate` returns only after that DELETE was answered, with frames or
without (decode=False), and also when the bytes turn out not to be a video."""
from __future__ import annotations

import threading
import time
from typing import Any

import pytest

import hostile_server as hs
from clips import NOISY_F as F, NOISY_H as H, NOISY_W as W
from hostile_jobs import CONTENT_PATH, file_route, job_routes
from vllm_omni_launcher.client.api import VideoClient, VideoRequest
from vllm_omni_launcher.client.bounds import bounds_for
from vllm_omni_launcher.client.streamed_download import download_decoding
from vllm_omni_launcher.client.transport import Transport
from vllm_omni_launcher.errors import LauncherError

HOLD_S = 20.0          # the longest the held DELETE waits for the test (never reached when all is well)


class HeldDelete:
    """DELETE /v1/videos/v1 that answers only once the test releases it; `arrived` is set when it came."""

    def __init__(self) -> None:
        self.arrived, self.release = threading.Event(), threading.Event()

    def __call__(self, peer: hs.Peer) -> None:
        self.arrived.set()
        self.release.wait(HOLD_S)
        hs.answer(200, {"id": "v1", "deleted": True})(peer)


def _generate_in_thread(url: str, decode: bool) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            with VideoClient(url) as client:
                out["result"] = client.generate(VideoRequest("x", width=W, height=H, num_frames=F, fps=16),
                                                poll_interval=0.05, decode=decode)
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            out["error"] = exc
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


@pytest.mark.parametrize("decode", [True, False], ids=["frames", "mp4-only"])
def test_generate_returns_only_after_the_one_delete_of_its_job_was_answered(noisy_mp4, decode):
    held = HeldDelete()
    routes = job_routes(file_route(noisy_mp4), job_id="v1")
    routes[("DELETE", "/v1/videos/v1")] = held
    server = hs.HostileServer(routes)
    try:
        thread, out = _generate_in_thread(server.url, decode)
        assert held.arrived.wait(HOLD_S), out
        assert thread.is_alive()                  # the DELETE is joined: generate waits for its answer
        held.release.set()
        thread.join(HOLD_S)
        assert not thread.is_alive() and "error" not in out, out
        assert len(server.calls("DELETE", "/v1/videos/v1")) == 1
        assert (out["result"].video is not None) is decode
        assert out["result"].mp4 == noisy_mp4
    finally:
        held.release.set()
        server.close()


def test_bytes_that_are_not_a_video_are_refused_and_their_job_still_deleted_once():
    junk = b"\x00\x00\x00\x18ftypisom" + bytes(4 << 20)          # larger than the tail's threshold
    server = hs.HostileServer(job_routes(file_route(junk), job_id="v1"))
    try:
        for decode in (True, False):
            before = len(server.calls("DELETE", "/v1/videos/v1"))
            with VideoClient(server.url) as client, pytest.raises(LauncherError):
                client.generate(VideoRequest("x", width=W, height=H, num_frames=F, fps=16), poll_interval=0.05,
                                decode=decode)
            assert len(server.calls("DELETE", "/v1/videos/v1")) == before + 1
    finally:
        server.close()


def test_the_downloaded_hook_runs_once_when_every_byte_is_in_and_before_the_decode_returns(hostile, noisy_mp4):
    server = hostile({("GET", CONTENT_PATH): file_route(noisy_mp4)})
    called: list[float] = []
    transport = Transport(server.url)
    try:
        got = download_decoding(transport, CONTENT_PATH, what="Downloading job v1", job_id="v1",
                                max_bytes=len(noisy_mp4) + 1024, cap_reason="", bounds=bounds_for(W, H, F, {}),
                                on_downloaded=lambda: called.append(time.monotonic()))
    finally:
        transport.close()
    assert got.mp4 == noisy_mp4 and got.video.num_frames == F
    assert len(called) == 1 and got.downloaded_at <= called[0]     # after the last byte, once
