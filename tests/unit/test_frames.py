"""client/frames.py + bounds.py: MP4 -> float32 [F, H, W, 3] frames (checked against what the
request allows), and IMAGE -> PNG for uploads.

Clips are encoded here with PyAV (H.264 yuv420p, like vLLM-Omni's encoder) from
frame_code frames, so each decoded frame can be checked for its index and seed.
"""
from __future__ import annotations

import io
import sys
import tracemalloc
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pytest
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "contract"))
import frame_code  # noqa: E402
from clips import encode_clip  # noqa: E402

from vllm_omni_launcher.client import frames as frames_mod  # noqa: E402
from vllm_omni_launcher.client.bounds import bounds_for  # noqa: E402
from vllm_omni_launcher.client.frames import DecodedVideo, decode_mp4  # noqa: E402
from vllm_omni_launcher.client.images import image_to_png  # noqa: E402
from vllm_omni_launcher.errors import LauncherError  # noqa: E402


FRAGMENTED = "frag_keyframe+empty_moov"     # fragmented MP4 (vLLM-Omni's streaming muxer): no frame count


def header_frames(data: bytes) -> int:
    with av.open(io.BytesIO(data)) as c:
        return c.streams.video[0].frames


def assert_frames(video: DecodedVideo, count: int, width: int, height: int, seed: int) -> None:
    assert isinstance(video, DecodedVideo)
    assert video.frames.dtype == np.float32
    assert video.frames.shape == (count, height, width, 3)
    assert video.frames.flags.c_contiguous
    assert float(video.frames.min()) >= 0.0 and float(video.frames.max()) <= 1.0
    assert [frame_code.decode(f) for f in video.frames] == [(i % 256, seed % 256) for i in range(count)]


def test_small_clip_decodes_to_float32_frames_with_index_seed_and_fps():
    data = encode_clip(9, 64, 64, fps=16, seed=7)
    video = decode_mp4(data)
    assert_frames(video, 9, 64, 64, 7)
    assert video.fps == pytest.approx(16.0)
    assert (video.num_frames, video.width, video.height) == (9, 64, 64)


def test_ti2v_sized_clip_decodes_1280x704():
    data = encode_clip(5, 1280, 704, fps=24, seed=300)
    video = decode_mp4(data)
    assert_frames(video, 5, 1280, 704, 300)
    assert video.fps == pytest.approx(24.0)


def test_fractional_fps_is_reported():
    video = decode_mp4(encode_clip(5, 64, 64, fps=Fraction(24000, 1001)))
    assert video.fps == pytest.approx(24000 / 1001, rel=1e-3)


def test_clip_without_frame_count_in_header_still_decodes():
    data = encode_clip(13, 64, 64, fps=16, seed=42, movflags=FRAGMENTED)
    assert header_frames(data) == 0  # a fragmented MP4 stores no per-stream frame count
    video = decode_mp4(data)
    assert_frames(video, 13, 64, 64, 42)


def test_stream_without_count_or_duration_grows_the_array(monkeypatch):
    # A header with neither a frame count nor a duration (the estimate is 0): capacity starts
    # small and must grow past it (more frames than the first chunk).
    count = frames_mod._MIN_GROW + 9
    data = encode_clip(count, 64, 64, fps=16, seed=5, movflags=FRAGMENTED)
    assert header_frames(data) == 0
    monkeypatch.setattr(frames_mod, "_expected_frames", lambda c, s, f: 0)
    video = decode_mp4(data)
    assert_frames(video, count, 64, 64, 5)


def test_header_overstating_the_count_is_trimmed(monkeypatch):
    data = encode_clip(6, 64, 64, seed=9)
    real = frames_mod._expected_frames
    monkeypatch.setattr(frames_mod, "_expected_frames", lambda c, s, f: real(c, s, f) + 10)
    video = decode_mp4(data)
    assert_frames(video, 6, 64, 64, 9)


def test_decode_writes_into_one_preallocated_array_without_stacking(monkeypatch):
    data = encode_clip(48, 320, 192, seed=11)

    def forbidden(*args, **kwargs):
        raise AssertionError("decode_mp4 must not stack/concatenate the whole clip")

    monkeypatch.setattr(np, "stack", forbidden)
    monkeypatch.setattr(np, "concatenate", forbidden)
    monkeypatch.setattr(np, "vstack", forbidden)
    out_bytes = 48 * 192 * 320 * 3 * 4
    tracemalloc.start()
    try:
        video = decode_mp4(data)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert video.frames.nbytes == out_bytes
    # A list of frames (uint8 or float) plus the output would exceed this bound.
    assert peak < 1.25 * out_bytes, f"peak {peak / 1e6:.1f} MB for a {out_bytes / 1e6:.1f} MB clip"


def test_garbage_bytes_raise_launcher_error_with_raw_ffmpeg_message():
    with pytest.raises(LauncherError) as info:
        # an MP4's first box, then garbage: FFmpeg's MP4 reader gets it and fails (no ftyp: server_mp4.py refuses first)
        decode_mp4(b"\x00\x00\x00\x10ftypisom\x00\x00\x02\x00" + b"this is not an mp4 file at all" * 10)
    assert "not a readable video" in info.value.what
    assert info.value.raw


def test_empty_download_raises_launcher_error():
    with pytest.raises(LauncherError, match="empty video"):
        decode_mp4(b"")


def _png_pixels(png: bytes) -> np.ndarray:
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    return np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))


def test_image_to_png_round_trips_float_and_uint8_and_batch():
    rgb = frame_code.encode(3, 4, 48, 32)
    assert np.array_equal(_png_pixels(image_to_png(rgb)), rgb)
    as_float = rgb.astype(np.float32) / 255.0
    assert np.array_equal(_png_pixels(image_to_png(as_float)), rgb)
    assert np.array_equal(_png_pixels(image_to_png(as_float[None])), rgb)  # ComfyUI IMAGE [1,H,W,3]
    rgba = np.concatenate([rgb, np.full((32, 48, 1), 255, np.uint8)], axis=2)
    assert np.array_equal(_png_pixels(image_to_png(rgba)), rgb)


def test_image_to_png_clips_out_of_range_floats():
    img = np.full((4, 4, 3), 1.7, np.float32)
    img[0, 0] = -0.5
    px = _png_pixels(image_to_png(img))
    assert px[0, 0].tolist() == [0, 0, 0] and px[1, 1].tolist() == [255, 255, 255]


def test_image_to_png_refuses_batches_and_bad_shapes_naming_the_image_setting():
    with pytest.raises(LauncherError) as info:
        image_to_png(np.zeros((2, 8, 8, 3), np.float32))
    assert info.value.setting == "image"
    with pytest.raises(LauncherError) as info:
        image_to_png(np.zeros((8, 8, 5), np.float32))
    assert info.value.setting == "image"


# ----------------------------------------------------------------------------- bounds: untrusted clips

def test_bounds_allow_what_upstream_legitimately_changes_and_nothing_else():
    b = bounds_for(250, 130, 10, {})
    assert b.widths == {250, 240, 224} and b.heights == {130, 128}   # floored to /16 and /32
    assert (b.min_frames, b.max_frames) == (9, 13)                    # 4k+1 at or below, and above
    b.check(240, 128, 9)
    b.check(224, 128, 13)
    for width, height, frames in ((256, 128, 9), (240, 144, 9), (240, 128, 5), (240, 128, 17)):
        with pytest.raises(LauncherError) as info:
            b.check(width, height, frames)
        assert f"got {width}x{height}x{frames}, asked for 250x130x10" in info.value.what
    assert bounds_for(832, 480, 81, {}).min_frames == bounds_for(832, 480, 81, {}).max_frames == 81


def test_bounds_follow_the_size_field_interpolation_and_unsent_sizes():
    assert bounds_for(64, 64, 9, {"size": "832x480"}).widths == {832}
    doubled = bounds_for(64, 64, 9, {}, frame_multiplier=2)
    assert (doubled.min_frames, doubled.max_frames) == (17, 18) and "x2 interpolated" in doubled.asked
    free = bounds_for(None, None, 9, {})           # upstream picks the size: only the area is bounded
    free.check(1280, 720, 9)
    free.check(720, 1280, 9)
    with pytest.raises(LauncherError):
        free.check(2048, 2048, 9)


def test_download_cap_is_16_bits_per_pixel_plus_a_mebibyte():
    assert bounds_for(256, 256, 9, {}).max_bytes == 256 * 256 * 9 * 2 + (1 << 20)
    # vLLM-Omni's own encoder settings on pure noise (the worst real content) stay well below it.
    rng = np.random.default_rng(0)
    buf = io.BytesIO()
    with av.open(buf, "w", format="mp4") as out:
        stream = out.add_stream("libx264", rate=16)
        stream.width, stream.height, stream.pix_fmt = 128, 128, "yuv420p"
        stream.options = {"preset": "ultrafast", "threads": "0"}
        for _ in range(9):
            noise = av.VideoFrame.from_ndarray(rng.integers(0, 256, (128, 128, 3), dtype=np.uint8), format="rgb24")
            for packet in stream.encode(noise):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    assert len(buf.getvalue()) < bounds_for(128, 128, 9, {}).max_bytes - (1 << 20)


def test_decode_with_bounds_accepts_the_request_and_interpolated_frames():
    assert_frames(decode_mp4(encode_clip(9, 64, 64, seed=2), bounds=bounds_for(64, 64, 9, {})), 9, 64, 64, 2)
    interpolated = encode_clip(17, 64, 64, seed=4)
    assert_frames(decode_mp4(interpolated, bounds=bounds_for(64, 64, 9, {}, frame_multiplier=2)), 17, 64, 64, 4)
    with pytest.raises(LauncherError, match="got 64x64x17, asked for 64x64x9"):
        decode_mp4(interpolated, bounds=bounds_for(64, 64, 9, {}))


def test_stream_without_a_frame_count_stops_at_the_bound_without_growing():
    # A fragmented MP4 carries no frame count: the array is sized for the most the request allows
    # and decoding stops at the first frame past it.
    data = encode_clip(40, 64, 64, seed=5, movflags=FRAGMENTED)
    assert header_frames(data) == 0
    tracemalloc.start()
    try:
        with pytest.raises(LauncherError) as info:
            decode_mp4(data, bounds=bounds_for(64, 64, 9, {}))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert "got 64x64x10+, asked for 64x64x9" in info.value.what
    assert peak < 2 * 9 * 64 * 64 * 3 * 4 + (1 << 20)


def test_short_clip_is_refused():
    with pytest.raises(LauncherError, match="got 64x64x5, asked for 64x64x9"):
        decode_mp4(encode_clip(5, 64, 64), bounds=bounds_for(64, 64, 9, {}))
