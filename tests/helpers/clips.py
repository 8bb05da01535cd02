"""Real H.264 MP4 clips made with PyAV, for the tests that decode, download or refuse them.

* `solid_clip`: one flat colour, tiny on disk whatever its size (a decode bomb when large);
* `noisy_clip`: noise, so frames differ and a decode error would show; the index after the data
  as upstream writes it (NOISY_W x NOISY_H x NOISY_F by default, large enough that a streamed
  download fetches its tail);
* `encode_clip`: frame i carries frame_code.encode(i, seed, ...), so a decoded frame says which
  frame and which seed it is.
"""
from __future__ import annotations

import io
from fractions import Fraction

import av
import numpy as np

import frame_code

NOISY_W, NOISY_H, NOISY_F = 320, 192, 25


def solid_clip(width: int, height: int, frames: int, container: str = "mp4") -> bytes:
    """H.264 yuv420p clip of one flat colour: tiny on disk whatever its size (a decode bomb)."""
    buf = io.BytesIO()
    with av.open(buf, "w", format=container) as out:
        stream = out.add_stream("libx264", rate=16)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.options = {"preset": "ultrafast", "tune": "zerolatency"}
        frame = av.VideoFrame.from_ndarray(np.full((height * 3 // 2, width), 90, np.uint8), format="yuv420p")
        for _ in range(frames):
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return buf.getvalue()


def noisy_clip(width: int = NOISY_W, height: int = NOISY_H, frames: int = NOISY_F) -> bytes:
    """A real H.264 MP4 of noise (so frames differ and decode errors would show), index at the end."""
    rng = np.random.default_rng(7)
    buf = io.BytesIO()
    with av.open(buf, "w", format="mp4") as out:
        stream = out.add_stream("libx264", rate=Fraction(16))
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.options = {"preset": "ultrafast", "crf": "18"}
        for _ in range(frames):
            frame = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return buf.getvalue()


def encode_clip(count: int, width: int, height: int, fps: float | Fraction = 16, seed: int = 7,
                container: str = "mp4", movflags: str = "") -> bytes:
    """H.264 yuv420p clip whose frame i is frame_code.encode(i, seed, w, h)."""
    rate = Fraction(fps).limit_denominator(1001)
    buf = io.BytesIO()
    with av.open(buf, "w", format=container, options={"movflags": movflags} if movflags else {}) as out:
        stream = out.add_stream("libx264", rate=rate)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.options = {"preset": "ultrafast", "crf": "18"}
        for i in range(count):
            frame = av.VideoFrame.from_ndarray(frame_code.encode(i, seed, width, height), format="rgb24")
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return buf.getvalue()
