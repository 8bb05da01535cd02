"""Decoding the server's MP4 while it downloads (client/body_buffer.py, client/streamed_download.py).

The MP4s are real (libx264 through PyAV, index after the data as vLLM-Omni writes them); the
servers are our own on 127.0.0.1: a FileResponse-like one that honours `Range` (the way
upstream's Starlette FileResponse does), and hostile variants (no range support, a tail that
disagrees with the file, a body that stops).
"""
from __future__ import annotations

import contextlib
import io
import threading
import time
from typing import Any, Callable, Iterator, Optional

import numpy as np
import pytest

import hostile_server as hs
from clips import NOISY_F as F, NOISY_H as H, NOISY_W as W, noisy_clip
from cancel_latency import CANCEL_LATENCY_S
from hostile_jobs import CONTENT_PATH as PATH, CancelOnceBlocked, file_route, job_body, job_routes
from vllm_omni_launcher.client import streamed_download
from vllm_omni_launcher.client.api import VideoClient, VideoRequest
from vllm_omni_launcher.client.body_buffer import BodyBuffer
from vllm_omni_launcher.client.bounds import bounds_for
from vllm_omni_launcher.client.frames import PreparedOutput, decode_mp4
from vllm_omni_launcher.client.streamed_download import download_decoding
from vllm_omni_launcher.client.transport import Cancelled, Deadlines, RetryPolicy, Transport
from vllm_omni_launcher.errors import LauncherError

HOLD_S = 20.0          # the longest a test's stalled answer waits for the client to do what it waits for


@pytest.fixture
def serve(hostile) -> Callable[[hs.Route], hs.HostileServer]:
    """A hostile server whose one route is the file at PATH."""
    return lambda route: hostile({("GET", PATH): route})


def fetch(url: str, data_len: int, **kw: Any) -> streamed_download.StreamedVideo:
    transport = Transport(url, deadlines=kw.pop("deadlines", Deadlines()), retry=kw.pop("retry", RetryPolicy()))
    try:
        return download_decoding(transport, PATH, what="Downloading job v1", job_id="v1", max_bytes=data_len + 1024,
                                 cap_reason="", bounds=bounds_for(W, H, F, {}), **kw)
    finally:
        transport.close()


# ----------------------------------------------------------------------------- the result

def test_streamed_decode_gives_exactly_the_frames_and_bytes_of_download_then_decode(serve, noisy_mp4):
    reference = decode_mp4(noisy_mp4, bounds=bounds_for(W, H, F, {}))
    server = serve(file_route(noisy_mp4))
    got = fetch(server.url, len(noisy_mp4))
    assert got.mp4 == noisy_mp4
    assert got.video.frames.shape == (F, H, W, 3) and got.video.frames.dtype == np.float32
    assert got.video.frames.flags.c_contiguous
    assert np.array_equal(got.video.frames, reference.frames) and got.video.fps == reference.fps == 16
    ranged = [e for e in server.calls("GET", PATH) if "range" in e.headers]
    assert [e.headers["range"] for e in ranged] == [f"bytes=-{streamed_download.TAIL_BYTES}"]


def until(condition: Callable[[], bool], timeout_s: float = HOLD_S) -> bool:
    """Wait for `condition` (polled), at most timeout_s; its final value."""
    end = time.monotonic() + timeout_s
    while not condition() and time.monotonic() < end:
        time.sleep(0.01)
    return condition()


@contextlib.contextmanager
def watched_reads() -> Iterator[list[tuple[float, int]]]:
    """Record every read of the streamed decoder: (when, file position after the read)."""
    seen: list[tuple[float, int]] = []
    original = streamed_download.decode_mp4

    def watching(source: Any, **kw: Any) -> Any:
        real_read = source.read

        def read(n: int = -1) -> bytes:
            out = real_read(n)
            seen.append((time.monotonic(), source.tell()))
            return out
        source.read = read
        return original(source, **kw)

    streamed_download.decode_mp4 = watching
    try:
        yield seen
    finally:
        streamed_download.decode_mp4 = original


def test_decoding_starts_before_the_last_byte_when_the_tail_comes_first(serve, noisy_mp4):
    """The whole answer stalls before its last quarter until the decoder has read frame data of
    the first three quarters (or HOLD_S passed): with the tail (the index) in, it has, so the
    decode ran while the download stalled. The stall ends on that event, not after a fixed time
    the client might miss on a busy box."""
    def in_middle(pos: int) -> bool:
        return len(noisy_mp4) // 3 < pos < len(noisy_mp4) * 3 // 4

    resumed: list[float] = []
    with watched_reads() as seen:
        def hold() -> None:
            until(lambda: any(in_middle(pos) for _, pos in seen))
            resumed.append(time.monotonic())

        server = serve(file_route(noisy_mp4, hold=hold))
        got = fetch(server.url, len(noisy_mp4))
    assert resumed and got.downloaded_at >= resumed[0]        # the stall was real
    middle = [pos for t, pos in seen if t < resumed[0] and in_middle(pos)]
    assert middle, "the decoder read no frame data while the download stalled"


def test_without_range_support_it_waits_for_the_whole_file_and_asks_once(serve, noisy_mp4):
    server = serve(file_route(noisy_mp4, ranges=False))
    got = fetch(server.url, len(noisy_mp4))
    assert got.mp4 == noisy_mp4 and got.video.num_frames == F
    assert len(server.calls("GET", PATH)) == 1                # no range asked of a server without them


def test_a_tail_that_disagrees_with_the_file_is_an_error_not_a_mixed_video(serve, noisy_mp4):
    bad = bytearray(noisy_mp4)
    bad[-40] ^= 0xFF                                          # inside the index
    split = len(noisy_mp4) * 3 // 4                                # where the whole answer stalls
    with watched_reads() as seen:
        # the last quarter waits until the decoder has read the tail (so it is in and must be
        # compared): a fixed pause would race the tail's connection on a busy box
        server = serve(file_route(noisy_mp4, tail_data=bytes(bad), hold=lambda: until(
            lambda: any(pos > split for _, pos in seen))))
        with pytest.raises(LauncherError) as info:
            fetch(server.url, len(noisy_mp4))
    assert "changed while it was being downloaded" in info.value.what and info.value.setting == "server"


def test_a_body_cut_short_is_the_download_error_even_while_decoding(serve, noisy_mp4):
    server = serve(file_route(noisy_mp4, cut_at=len(noisy_mp4) // 2))
    with pytest.raises(LauncherError) as info:
        fetch(server.url, len(noisy_mp4), retry=RetryPolicy(tries=1))
    assert info.value.what.startswith("Lost the connection")  # the download's error, not the decoder's
    assert "IncompleteRead" in info.value.raw


def test_cancel_during_a_stalled_download_ends_the_decode_within_a_second(serve, noisy_mp4):
    cancel = CancelOnceBlocked(file_route(noisy_mp4, hold=lambda: time.sleep(30.0)), after_s=0.5)
    server = serve(cancel.serve)
    with pytest.raises(Cancelled):
        fetch(server.url, len(noisy_mp4), should_cancel=cancel)
    assert cancel.at is not None and time.monotonic() - cancel.at < CANCEL_LATENCY_S


def test_a_clip_outside_the_request_is_refused_before_frames_are_allocated(serve):
    big = noisy_clip(640, 384, 5)
    server = serve(file_route(big))
    transport = Transport(server.url)
    try:
        with pytest.raises(LauncherError) as info:
            download_decoding(transport, PATH, what="d", job_id="v1", max_bytes=len(big) + 1, cap_reason="",
                              bounds=bounds_for(W, H, F, {}))
    finally:
        transport.close()
    assert "does not match the request" in info.value.what


# ----------------------------------------------------------------------------- the buffer

def whole_sink(buf: BodyBuffer, size: Optional[int]) -> Any:
    sink = buf.whole()
    sink.begin(200, {}, size)
    return sink


def tail_sink(buf: BodyBuffer, start: int, data: bytes) -> None:
    sink = buf.tail()
    sink.begin(206, {"Content-Range": f"bytes {start}-{len(data) - 1}/{len(data)}"}, len(data) - start)
    sink.fill(start, data[start:])
    sink.done(len(data) - start)


def test_a_read_waits_for_its_bytes_and_returns_them_once_they_arrive():
    buf = BodyBuffer()
    sink = whole_sink(buf, 8)
    reader = buf.reader()
    t0 = time.monotonic()                                     # before the timer: it fills >= 0.3 s later
    threading.Timer(0.3, lambda: sink.fill(0, b"abcd")).start()
    assert reader.read(4) == b"abcd" and time.monotonic() - t0 >= 0.25
    sink.fill(4, b"efgh")
    sink.done(8)
    assert reader.read(100) == b"efgh" and reader.read(1) == b""
    assert buf.value() == b"abcdefgh"


def test_the_tail_is_readable_before_the_middle_and_the_end_seek_knows_the_size():
    data = bytes(range(200))
    buf = BodyBuffer()
    whole = whole_sink(buf, len(data))
    whole.fill(0, data[:50])
    tail_sink(buf, 150, data)
    reader = buf.reader()
    assert reader.seek(-10, io.SEEK_END) == 190 and reader.read(10) == data[190:]
    reader.seek(150)
    assert reader.read(50) == data[150:]
    reader.seek(0)
    assert reader.read(50) == data[:50]
    whole.fill(50, data[50:])
    whole.done(len(data))
    assert buf.value() == data


def test_a_retry_that_sends_other_bytes_for_what_was_already_read_is_an_error():
    buf = BodyBuffer()
    sink = whole_sink(buf, 8)
    sink.fill(0, b"abcd")
    sink.fill(0, b"ab")                                       # a second try from 0, same bytes: fine
    with pytest.raises(LauncherError) as info:
        sink.fill(2, b"XY")
    assert "changed" in info.value.what


def test_a_whole_answer_that_contradicts_a_complete_tail_is_an_error():
    data = bytes(range(100))
    buf = BodyBuffer()
    sink = whole_sink(buf, 100)
    tail_sink(buf, 60, data)
    sink.fill(0, data[:60])
    with pytest.raises(LauncherError):
        sink.fill(60, b"\x00" * 40)


def test_without_a_length_the_buffer_grows_and_the_end_comes_with_the_last_byte():
    buf = BodyBuffer()
    sink = whole_sink(buf, None)
    reader = buf.reader()
    sink.fill(0, b"xyz")
    threading.Timer(0.2, lambda: sink.done(3)).start()
    assert reader.seek(0, io.SEEK_END) == 3                  # waited for the end
    reader.seek(0)
    assert reader.read(10) == b"xyz" and reader.read(10) == b""


def test_a_failed_download_wakes_a_blocked_reader_with_its_error():
    buf = BodyBuffer()
    whole_sink(buf, 10)
    boom = LauncherError("The download broke", "test", "none")
    threading.Timer(0.2, lambda: buf.fail(boom)).start()
    with pytest.raises(LauncherError) as info:
        buf.reader().read(5)
    assert info.value is boom


# ----------------------------------------------------------------------------- the output, made early

def test_decode_into_a_prepared_array_fills_that_array_with_the_same_frames(noisy_mp4):
    reference = decode_mp4(noisy_mp4, bounds=bounds_for(W, H, F, {}))
    prepared = PreparedOutput(F, H, W)
    array = prepared.take()
    assert array is not None and prepared.take() is None              # handed over once
    got = decode_mp4(noisy_mp4, bounds=bounds_for(W, H, F, {}), into=array)
    assert got.frames is array and np.array_equal(got.frames, reference.frames)


def test_a_prepared_array_of_another_shape_is_left_alone(noisy_mp4):
    other = PreparedOutput(F - 4, H, W).take()
    assert other is not None
    got = decode_mp4(noisy_mp4, into=other)
    assert got.frames is not other and got.frames.shape == (F, H, W, 3) and other.shape == (F - 4, H, W, 3)
    assert not other.any()                                          # never written


def test_generate_decodes_into_the_array_it_prepared_once_the_job_was_due(noisy_mp4, monkeypatch):
    made: list[PreparedOutput] = []
    original_take = PreparedOutput.take

    def take(self: PreparedOutput) -> Any:
        array = original_take(self)
        if array is not None:
            made.append(array)
        return array

    monkeypatch.setattr(PreparedOutput, "take", take)
    routes = job_routes(file_route(noisy_mp4), job_id="v1", status=_status_sequence(["in_progress", "completed"]))
    server = hs.HostileServer(routes)
    try:
        with VideoClient(server.url) as client:
            result = client.generate(VideoRequest("x", width=W, height=H, num_frames=F, fps=16),
                                     due=lambda: True, poll_interval=0.05)
    finally:
        server.close()
    assert made and result.video is not None and result.video.frames is made[0]
    assert np.array_equal(result.video.frames, decode_mp4(noisy_mp4).frames)


def _status_sequence(statuses: list[str]) -> hs.Route:
    """GET /v1/videos/v1 answers each status in turn, then the last one forever."""
    left = list(statuses)

    def route(peer: hs.Peer) -> None:
        status = left.pop(0) if len(left) > 1 else left[0]
        hs.answer(200, job_body("v1", status))(peer)
    return route


@pytest.mark.parametrize("width, height, frames, expected", [
    (1280, 704, 121, (121, 704, 1280)),    # TI2V-5B 720p: nothing upstream floors or rounds
    (832, 480, 49, (49, 480, 832)),
    (1280, 720, 81, None),                 # 720 stays for A14B, becomes 704 for TI2V-5B: not known here
    (1280, 704, 120, None),                # rounded to 4k+1 by the server
    (None, None, 81, None),                # the server picks the size
])
def test_the_output_is_prepared_only_for_a_shape_the_request_fixes(width, height, frames, expected):
    from vllm_omni_launcher.client.bounds import expected_shape

    assert expected_shape(VideoRequest("x", width=width, height=height, num_frames=frames).bounds()) == expected
