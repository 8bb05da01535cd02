"""The rgb24 conversion with one scaler per converting thread (client/frames.py `_rgb24`) and the
decoder settings the overhead bench compares: every path gives exactly the IMAGE of before, i.e.
PyAV's `to_ndarray(format="rgb24")` / 255 as float32, with its shape and dtype; and the reader's
wait for missing bytes (client/body_buffer.py `read_wait_s`) that tells whether a decode was
download-bound.

The MP4 is real (libx264 noise through PyAV, the index after the data as vLLM-Omni writes it);
servers are our own on 127.0.0.1 (tests/helpers/hostile_server.py).
"""
from __future__ import annotations

import io
import threading
import time
from typing import Any

import av
import av.video.reformatter
import numpy as np
import pytest

import hostile_server as hs
from clips import NOISY_F as F, NOISY_H as H, NOISY_W as W
from hostile_jobs import CONTENT_PATH as PATH, file_route
from vllm_omni_launcher.client import frames as frames_mod
from vllm_omni_launcher.client.body_buffer import BodyBuffer
from vllm_omni_launcher.client.bounds import bounds_for
from vllm_omni_launcher.client.frames import decode_mp4
from vllm_omni_launcher.client.streamed_download import download_decoding
from vllm_omni_launcher.client.transport import Transport


@pytest.fixture(scope="module")
def reference(noisy_mp4: bytes) -> np.ndarray:
    """The IMAGE as it was: each frame through PyAV's own to_ndarray(format="rgb24"), times 1/255."""
    with av.open(io.BytesIO(noisy_mp4)) as container:
        rgb = [f.to_ndarray(format="rgb24") for f in container.decode(container.streams.video[0])]
    return np.stack(rgb).astype(np.float32) * np.float32(1.0 / 255.0)


def _same(video: Any, reference: np.ndarray) -> None:
    assert video.frames.dtype == np.float32 and video.frames.flags.c_contiguous
    assert video.frames.shape == (F, H, W, 3) == reference.shape
    assert np.array_equal(video.frames, reference)


@pytest.mark.parametrize("settings", [
    {}, {"workers": 0}, {"workers": 1}, {"workers": 4}, {"threads": 1}, {"threads": 2, "workers": 2},
    {"thread_type": "FRAME"}, {"thread_type": "SLICE", "workers": 2}, {"buffer_size": 256 << 10},
])
def test_every_decoder_setting_gives_exactly_the_image_of_to_ndarray(noisy_mp4, reference, settings):
    _same(decode_mp4(noisy_mp4, bounds=bounds_for(W, H, F, {}), **settings), reference)


def test_the_scaler_is_made_once_per_converting_thread_not_once_per_frame(noisy_mp4, reference, monkeypatch):
    made: list[int] = []
    real = av.video.reformatter.VideoReformatter

    def counting() -> Any:
        made.append(threading.get_ident())
        return real()

    monkeypatch.setattr(av.video.reformatter, "VideoReformatter", counting)
    _same(decode_mp4(noisy_mp4, workers=2), reference)
    assert 1 <= len(made) <= 2 and len(set(made)) == len(made)      # 25 frames, 2 threads


def test_a_pyav_without_the_threads_option_is_asked_once_per_thread_not_once_per_frame(noisy_mp4, reference, monkeypatch):
    """PyAV releases before reformat(threads=) raise TypeError for it: the converter drops the option
    after the first refusal on its thread instead of paying an exception on every frame."""
    refused: list[int] = []
    real = av.video.reformatter.VideoReformatter

    class OldReformatter:
        def __init__(self) -> None:
            self._real = real()

        def reformat(self, frame: Any, **options: Any) -> Any:
            if "threads" in options:
                refused.append(threading.get_ident())
                raise TypeError("reformat() got an unexpected keyword argument 'threads'")
            return self._real.reformat(frame, **options)

    monkeypatch.setattr(av.video.reformatter, "VideoReformatter", OldReformatter)
    _same(decode_mp4(noisy_mp4, workers=2), reference)
    assert 1 <= len(refused) <= 2 and len(set(refused)) == len(refused)   # 25 frames, 2 threads


def test_a_frame_of_another_size_is_scaled_like_to_ndarray_scales_it(noisy_mp4):
    with av.open(io.BytesIO(noisy_mp4)) as container:
        frame = next(container.decode(container.streams.video[0]))
        expected = frame.to_ndarray(format="rgb24", width=W // 2, height=H // 2)
        got = frames_mod._rgb24(frame, W // 2, H // 2)
    assert got.shape == (H // 2, W // 2, 3) and got.dtype == np.uint8
    assert np.array_equal(got, expected)


def test_the_streamed_path_with_other_decoder_settings_gives_the_same_image(noisy_mp4, reference):
    server = hs.HostileServer({("GET", PATH): file_route(noisy_mp4)})
    try:
        with Transport(server.url) as http:
            got = download_decoding(http, PATH, what="Downloading job v1", job_id="v1", max_bytes=len(noisy_mp4) + 1,
                                    cap_reason="", bounds=bounds_for(W, H, F, {}), workers=1, threads=2,
                                    thread_type="FRAME", buffer_size=256 << 10)
    finally:
        server.close()
    assert got.mp4 == noisy_mp4 and got.read_wait_s >= 0.0
    _same(got.video, reference)


def test_the_reader_counts_its_wait_for_bytes_not_yet_downloaded():
    buf = BodyBuffer()
    sink = buf.whole()
    sink.begin(200, {}, 4)
    # The bytes come once the reader is blocked on them (not after a fixed delay, which a busy box
    # could let pass before the read even starts: then there would be no wait to count).
    blocked = threading.Event()
    wait = buf._raise_or_wait

    def waiting() -> None:
        blocked.set()
        wait()
    buf._raise_or_wait = waiting  # type: ignore[method-assign]
    threading.Thread(target=lambda: (blocked.wait(30), sink.fill(0, b"abcd")), daemon=True).start()
    start = time.monotonic()
    assert buf.reader().read(4) == b"abcd"
    assert 0.0 < buf.read_wait_s <= time.monotonic() - start


def test_a_reader_whose_bytes_are_in_never_counts_a_wait():
    buf = BodyBuffer()
    sink = buf.whole()
    sink.begin(200, {}, 4)
    sink.fill(0, b"abcd")
    sink.done(4)
    reader = buf.reader()
    assert reader.read(2) == b"ab" and reader.read() == b"cd" and reader.read() == b""
    assert buf.read_wait_s == 0.0
