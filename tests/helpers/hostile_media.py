"""Files a hostile server may send as "the MP4", made here with PyAV (tests/unit/test_untrusted_mp4.py).

* `ffconcat(path)`: an FFmpeg concat script naming a local file (probed, FFmpeg opens that file);
* `SDP`: a session description (probed, FFmpeg opens UDP sockets and waits for packets);
* `clip(codec, pix_fmt, container)`: a real clip of another codec (mpeg4, mjpeg), pixel format
  (yuv444p) or container (Matroska) than vLLM-Omni's H.264 yuv420p MP4;
* `resized(...)`: an MP4 whose header says one frame size while later frames have another: two
  Annex-B H.264 encodes back to back, remuxed into one MP4 track, so the second one's parameter sets
  (a new size) travel in-band after the first one's frames;
* `long_black(...)`: a real H.264 MP4 of many black frames made from two encoded ones (a key frame,
  then one unchanged frame repeated): a few KB whatever its frame count, at the cost of one encode.
"""
from __future__ import annotations

import io
from fractions import Fraction

import av
import numpy as np

from clips import solid_clip

SDP = (b"v=0\r\no=- 0 0 IN IP4 127.0.0.1\r\ns=clip\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\n"
       b"m=video 45123 RTP/AVP 96\r\na=rtpmap:96 H264/90000\r\n")


def ffconcat(path: str) -> bytes:
    return f"ffconcat version 1.0\nfile {path}\n".encode()


def clip(codec: str, pix_fmt: str, container: str = "mp4", width: int = 64, height: int = 64,
         frames: int = 5) -> bytes:
    buf = io.BytesIO()
    with av.open(buf, "w", format=container) as out:
        stream = out.add_stream(codec, rate=16)
        stream.width, stream.height, stream.pix_fmt = width, height, pix_fmt
        for i in range(frames):
            frame = av.VideoFrame.from_ndarray(np.full((height, width, 3), 10 * i, np.uint8), format="rgb24")
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return buf.getvalue()


def _remux(packets: list[bytes], extradata_source: bytes) -> bytes:
    """`packets` (Annex-B access units) as the samples of one MP4 track, one frame each at 16 fps."""
    out_buf = io.BytesIO()
    rate = Fraction(1, 16)
    with av.open(io.BytesIO(extradata_source), format="h264") as src, av.open(out_buf, "w", format="mp4") as dst:
        track = dst.add_stream_from_template(src.streams.video[0])
        track.time_base = rate
        for i, data in enumerate(packets):
            packet = av.Packet(data)
            packet.stream, packet.pts, packet.dts, packet.time_base = track, i, i, rate
            packet.is_keyframe = i == 0
            dst.mux(packet)
    return out_buf.getvalue()


def long_black(width: int, height: int, frames: int) -> bytes:
    data = solid_clip(width, height, 2, container="h264")
    with av.open(io.BytesIO(data), format="h264") as src:
        key, same = (bytes(p) for p in src.demux(src.streams.video[0]) if p.size)
    return _remux([key] + [same] * (frames - 1), data)


def resized(first: tuple[int, int, int], then: tuple[int, int, int]) -> bytes:
    """An MP4 of `first` = (width, height, frames) then `then`: its header (avcC, track size)
    describes only the first part."""
    data = solid_clip(*first, container="h264") + solid_clip(*then, container="h264")
    out_buf = io.BytesIO()
    rate = Fraction(1, 16)
    with av.open(io.BytesIO(data), format="h264") as src, av.open(out_buf, "w", format="mp4") as dst:
        source = src.streams.video[0]
        track = dst.add_stream_from_template(source)
        track.time_base = rate
        for i, packet in enumerate(p for p in src.demux(source) if p.size):
            packet.stream, packet.pts, packet.dts, packet.time_base = track, i, i, rate
            dst.mux(packet)
    return out_buf.getvalue()
