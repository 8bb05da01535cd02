"""A clip of natural content for the client path's cost (bench/overhead_bench.py --natural): smooth
motion and texture encoded with upstream's encoder settings, served like /content (no GPU), so what a
real clip costs shows next to a random-weight model's noise.
"""
from __future__ import annotations

import io
import time
from fractions import Fraction
from typing import Any

import numpy as np

from decode_levers import download_levers, rgb24_per_frame_scaler, served_mp4

# vLLM-Omni's one-shot MP4 encoder (vllm_omni/diffusion/utils/media_utils.py, mux_video_audio_bytes,
# with the Wan defaults of wan2_2/chunked_mp4.py): libx264, yuv420p, crf 18, preset ultrafast,
# threads 0, x264's default GOP (keyint 250: one keyframe for any Wan clip), index after the data.
UPSTREAM_X264 = {"crf": "18", "preset": "ultrafast", "threads": "0"}


def natural_clip(width: int, height: int, frames: int, fps: int = 24) -> bytes:
    """A clip of smooth moving content, encoded as upstream encodes: a camera panning over a
    soft-textured scene (blurred noise with fine detail) with a bright disc crossing it, so the
    encoder sees motion and texture like a real clip rather than a random-weight model's noise."""
    import av

    rng = np.random.default_rng(5)
    pan = 3                                     # pixels per frame, right and down
    th, tw = height + pan * frames + 8, width + pan * frames + 8
    coarse = rng.integers(0, 256, size=(th // 8 + 2, tw // 8 + 2, 3)).astype(np.float32)
    texture = np.repeat(np.repeat(coarse, 8, 0), 8, 1)[:th, :tw]
    for axis in (0, 1):                         # box blur 9 px, twice: soft blobs
        for _ in range(2):
            c = np.cumsum(texture, axis=axis, dtype=np.float32)
            lo = np.take(c, np.arange(texture.shape[axis]) - 9, axis=axis, mode="clip")
            texture = (c - lo) / 9.0
    texture = np.clip(texture * 0.7 + 40 + rng.normal(0, 4, texture.shape[:2])[..., None], 0, 255).astype(np.uint8)
    radius = int(height * 0.12)
    yy, xx = np.mgrid[-radius:radius + 1, -radius:radius + 1]
    disc = xx ** 2 + yy ** 2 < radius ** 2
    buf = io.BytesIO()
    with av.open(buf, "w", format="mp4") as out:
        stream = out.add_stream("libx264", rate=Fraction(fps))
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.options = dict(UPSTREAM_X264)
        for i in range(frames):
            frame = texture[i * pan:i * pan + height, i * pan:i * pan + width].copy()
            cx = int(width * (0.15 + 0.7 * i / max(1, frames - 1)))
            cy = height // 2
            frame[cy - radius:cy + radius + 1, cx - radius:cx + radius + 1][disc] = (235, 200, 90)
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return buf.getvalue()



def natural_levers(shape: tuple[int, int, int], repeat: int, python: str) -> dict[str, Any]:
    """The client path (decode while downloading, prepared output) on natural_clip of this shape,
    served like /content, next to the download alone and the decode from memory."""
    from vllm_omni_launcher.client.bounds import bounds_for
    from vllm_omni_launcher.client.frames import decode_mp4

    width, height, frames = shape
    t = time.perf_counter()
    data = natural_clip(width, height, frames)
    made_s = round(time.perf_counter() - t, 2)
    bounds = bounds_for(width, height, frames, {})
    assert decode_mp4(data, bounds=bounds).frames.shape == (frames, height, width, 3)
    with served_mp4(data, python) as url:
        out = download_levers(url, None, "bench", bounds, repeat, (frames, height, width),
                              settings={"shipped": {}, "workers4": {"workers": 4},
                                        "scaler_per_frame": {"scaler": rgb24_per_frame_scaler}})
    out["encoder"] = {"codec": "libx264", "pix_fmt": "yuv420p", **UPSTREAM_X264, "made_s": made_s}
    return out

