"""Does 0.30's worker-side MP4 (`extra_params.preencode_mp4`) cost the client's decode more than the serving
layer's one-shot MP4 of the same frames? And is it bigger?

Three MP4s of one clip, each made by vLLM-Omni 0.30's own code (run this under the server venv):

* worker: what the Wan pipelines make with `preencode_mp4` (`decode_to_mp4`, pipeline_wan2_2.py:981): the
  frames pushed as the Wan VAE publishes them (1 frame, then 4 per latent frame; BCTHW floats in -1..1)
  into `ChunkedVideoMP4Session` with the Wan defaults (batch_frames 17, fps 24, preset ultrafast, threads 0),
  as tests/contract/stub_serve_gpu.py's `_worker_mp4` does. Its `ChunkedMP4Encoder` muxes through
  `mux_av_video_audio_bytes`: rgb24 frames into a plain `av.open(format="mp4")`, no movflags.
* plain: the serving layer's one-shot encode of the same uint8 frames (serving_video.py: `_encode_video_bytes`
  with the response's `_PlanarFrameConverter(8)`; gbrp frames into the same `mux_av_video_audio_bytes`).
* fragmented: for reference only, the WebSocket streaming path (`FragmentedMP4Muxer`, movflags
  +frag_every_frame+empty_moov+default_base_moof, fed 17 frames at a time): no `/v1/videos` job returns it.

Each is timed with client.frames.decode_mp4 (bounds from the request, as the client decodes a job's MP4),
variants alternating, in this process and, with --client-python, again under that Python (the ComfyUI-side
PyAV); frames are compared with the source (PSNR) and each MP4's top-level boxes, size, decode_mp4 and
probe_mp4 acceptance (warnings and log records included) are recorded.

    .venv-server/bin/python bench/worker_mp4_decode.py --shape 1280x704x121 --repeat 5 \
        --client-python .venv/bin/python --out bench/results/cpu-worker-mp4-decode.json
"""
from __future__ import annotations

import argparse
import io
import json
import logging
import os
import platform
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import av
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from gpu.common import import_package  # noqa: E402

import_package()
from vllm_omni_launcher.client.bounds import bounds_for  # noqa: E402
from vllm_omni_launcher.client.frames import decode_mp4, probe_mp4  # noqa: E402

VARIANTS = ("worker", "plain", "fragmented")
MADE_BY = {
    "worker": "preencode_mp4: ChunkedVideoMP4Session (batch_frames 17, VAE-shaped chunks 1+4+4..) -> ChunkedMP4Encoder "
              "-> mux_av_video_audio_bytes (rgb24 frames, plain mp4, no movflags)",
    "plain": "serving layer one-shot: _encode_video_bytes with _PlanarFrameConverter(8) -> mux_av_video_audio_bytes "
             "(gbrp frames, plain mp4, no movflags)",
    "fragmented": "reference only (WebSocket m4s streaming, not a /v1/videos job): FragmentedMP4Muxer, movflags "
                  "+frag_every_frame+empty_moov+default_base_moof, 17 frames a call",
}
FPS = 24
CACHE = ROOT / "bench" / "out" / "worker_mp4_decode"


def noise_frames(width: int, height: int, frames: int, seed: int = 1234) -> np.ndarray:
    """A random-weight model's kind of frames: 2x2-pixel noise, +-72 around grey (bench/decode_bench.py's)."""
    rng = np.random.default_rng(seed)
    small = rng.integers(56, 200, size=(frames, height // 2, width // 2, 3), dtype=np.uint8)
    return np.ascontiguousarray(small.repeat(2, axis=1).repeat(2, axis=2))


def natural_frames(width: int, height: int, frames: int) -> np.ndarray:
    """bench/natural_clip.py's panning scene, decoded back to uint8 RGB (smooth motion and texture)."""
    from natural_clip import natural_clip

    out = np.empty((frames, height, width, 3), dtype=np.uint8)
    with av.open(io.BytesIO(natural_clip(width, height, frames, FPS)), format="mp4") as container:
        for index, frame in enumerate(container.decode(video=0)):
            out[index] = frame.to_ndarray(format="rgb24")
    return out


def worker_mp4(frames: np.ndarray) -> tuple[bytes, float]:
    """The Wan pipeline's preencode_mp4 bytes for `frames`, through upstream's ChunkedVideoMP4Session, and the
    seconds the session took (the CPU float chunks are made beforehand: on a GPU they are the VAE's output)."""
    import torch
    from vllm_omni.diffusion.models.wan2_2.chunked_mp4 import (
        resolve_wan_output_fps,
        resolve_wan_preencode_batch_frames,
        resolve_wan_video_codec_options,
    )
    from vllm_omni.diffusion.utils.chunked_video import ChunkedVideoMP4Session, quantize_chunk

    sp = SimpleNamespace(extra_args={"preencode_mp4": True}, fps=FPS)
    video = torch.from_numpy(frames).permute(3, 0, 1, 2).unsqueeze(0)          # uint8 BCTHW, a view
    chunks = [video[:, :, start:(1 if start == 0 else start + 4)].float().div_(127.5).sub_(1.0)
              for start in [0, *range(1, video.shape[2], 4)]]
    # float32 -1..1 quantizes back to exactly these bytes, so every variant encodes the same frames
    assert torch.equal(torch.cat([quantize_chunk(c, (-1.0, 1.0)) for c in chunks], 1), torch.from_numpy(frames)[None])
    t = time.perf_counter()
    session = ChunkedVideoMP4Session(value_range=(-1.0, 1.0), fps=resolve_wan_output_fps(sp),
                                     batch_frames=resolve_wan_preencode_batch_frames(sp),
                                     video_codec_options=resolve_wan_video_codec_options(sp))
    try:
        for chunk in chunks:
            session.push(chunk)
        data = session.finish()[0]
    except BaseException:
        session.abort()
        raise
    return data, time.perf_counter() - t


def plain_mp4(frames: np.ndarray) -> tuple[bytes, float]:
    """The serving layer's one-shot encode of the same frames (serving_video.py's call, its defaults)."""
    from vllm_omni.entrypoints.openai.serving_video import _VIDEO_RESPONSE_FRAME_CONVERSION_WORKERS
    from vllm_omni.entrypoints.openai.video_api_utils import _encode_video_bytes, _PlanarFrameConverter

    t = time.perf_counter()
    converter = _PlanarFrameConverter(max_workers=_VIDEO_RESPONSE_FRAME_CONVERSION_WORKERS)
    try:
        data = _encode_video_bytes(frames, fps=FPS, video_codec_options={"preset": "ultrafast", "threads": "0"},
                                   frame_converter=converter)
    finally:
        converter.shutdown()
    return data, time.perf_counter() - t


def fragmented_mp4(frames: np.ndarray) -> tuple[bytes, float]:
    """The streaming path's fragmented MP4 (a moof per frame), 17 frames a call, for reference."""
    from vllm_omni.diffusion.utils.media_utils import FragmentedMP4Muxer

    t = time.perf_counter()
    muxer = FragmentedMP4Muxer(width=frames.shape[2], height=frames.shape[1], fps=FPS,
                               video_codec_options={"preset": "ultrafast", "threads": "0"})
    parts = [muxer.mux_video_frames(frames[i:i + 17]) for i in range(0, len(frames), 17)]
    data = b"".join(parts) + muxer.close()
    return data, time.perf_counter() - t


def top_boxes(data: bytes) -> dict[str, Any]:
    """The MP4's top-level boxes: counts and order of the first few (where the index sits)."""
    pos, order, counts = 0, [], {}
    while pos + 8 <= len(data):
        size, kind = int.from_bytes(data[pos:pos + 4], "big"), data[pos + 4:pos + 8].decode("latin-1")
        size = int.from_bytes(data[pos + 8:pos + 16], "big") if size == 1 else (size or len(data) - pos)
        counts[kind] = counts.get(kind, 0) + 1
        if len(order) < 8:
            order.append(kind)
        pos += size
    return {"counts": counts, "first": order}


def acceptance(data: bytes, bounds: Any) -> dict[str, Any]:
    """What the client's checks say of `data`: decode_mp4 and probe_mp4 with the request's bounds, and any
    warning or log record (WARNING and up) they raise."""
    records: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: records.append(f"{record.name}: {record.getMessage()}")  # type: ignore[method-assign]
    logging.getLogger().addHandler(handler)
    out: dict[str, Any] = {}
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for name, call in (("decode_mp4", lambda: decode_mp4(data, bounds=bounds).frames.shape),
                               ("probe_mp4", lambda: tuple(vars(probe_mp4(data, bounds=bounds)).values()))):
                try:
                    out[name] = {"accepted": True, "result": list(call())}
                except Exception as exc:  # noqa: BLE001 (recorded: a refusal is the finding)
                    out[name] = {"accepted": False, "error": f"{type(exc).__name__}: {exc}"}
        out["warnings"] = [str(w.message) for w in caught]
    finally:
        logging.getLogger().removeHandler(handler)
    out["log_records"] = records
    return out


def psnr(decoded: np.ndarray, source: np.ndarray) -> float:
    """PSNR (dB) of decode_mp4's floats against the uint8 source, chunked to keep memory flat."""
    total = 0.0
    for i in range(len(source)):
        total += float(np.mean(np.square(decoded[i] * 255.0 - source[i].astype(np.float32)), dtype=np.float64))
    mse = total / len(source)
    return round(10 * np.log10(255.0 ** 2 / mse), 3) if mse > 0 else float("inf")


def time_decodes(paths: dict[str, Path], shape: tuple[int, int, int], repeat: int) -> dict[str, Any]:
    """decode_mp4 on each variant's bytes, variants alternating (order rotated each round); seconds."""
    width, height, count = shape
    bounds = bounds_for(width, height, count, {})
    blobs = {name: path.read_bytes() for name, path in paths.items()}
    names = list(blobs)
    runs: dict[str, list[float]] = {name: [] for name in names}
    decode_mp4(blobs[names[0]], bounds=bounds)                      # warm-up: imports, first page faults
    load_before = os.getloadavg()
    for r in range(repeat):
        for name in names[r % len(names):] + names[:r % len(names)]:
            t = time.perf_counter()
            video = decode_mp4(blobs[name], bounds=bounds)
            runs[name].append(round(time.perf_counter() - t, 4))
            assert video.frames.shape == (count, height, width, 3)
            del video
    out: dict[str, Any] = {"runs_s": runs, "av": av.__version__, "python": sys.executable,
                           "loadavg_1_5_15_before_after": [load_before, os.getloadavg()]}
    for stat, fn in (("median", statistics.median), ("min", min)):   # min: the run least slowed by other load
        values = {name: fn(runs[name]) for name in names}
        out[f"{stat}_s"] = values
        out[f"{stat}_ratio_over_plain"] = {name: round(values[name] / values["plain"], 4) for name in names}
    return out


def build(shape: tuple[int, int, int]) -> dict[str, Any]:
    """Make each clip's three MP4s (cached under bench/out/) and record size, boxes, acceptance and PSNR."""
    width, height, count = shape
    bounds = bounds_for(width, height, count, {})
    CACHE.mkdir(parents=True, exist_ok=True)
    clips: dict[str, Any] = {}
    for clip, make in (("noise", noise_frames), ("natural", natural_frames)):
        source = make(width, height, count)
        row: dict[str, Any] = {"variants": {}}
        decoded: dict[str, np.ndarray] = {}
        for name, encode in (("worker", worker_mp4), ("plain", plain_mp4), ("fragmented", fragmented_mp4)):
            data, made_s = encode(source)
            (CACHE / f"{clip}-{name}-{width}x{height}x{count}.mp4").write_bytes(data)
            decoded[name] = decode_mp4(data, bounds=bounds).frames
            row["variants"][name] = {"bytes": len(data), "encode_s": round(made_s, 2), "boxes": top_boxes(data),
                                     "psnr_vs_source_db": psnr(decoded[name], source),
                                     "client_checks": acceptance(data, bounds)}
        plain_bytes = (CACHE / f"{clip}-plain-{width}x{height}x{count}.mp4").read_bytes()
        row["bytes_identical_to_plain"] = {n: (CACHE / f"{clip}-{n}-{width}x{height}x{count}.mp4").read_bytes()
                                           == plain_bytes for n in VARIANTS}
        row["frames_equal_plain"] = {n: bool(np.array_equal(decoded[n], decoded["plain"])) for n in VARIANTS}
        row["bytes_ratio_over_plain"] = {n: round(v["bytes"] / row["variants"]["plain"]["bytes"], 4)
                                         for n, v in row["variants"].items()}
        clips[clip] = row
        del source, decoded
    return clips


def timings(shape: tuple[int, int, int], repeat: int) -> dict[str, Any]:
    width, height, count = shape
    return {clip: time_decodes({n: CACHE / f"{clip}-{n}-{width}x{height}x{count}.mp4" for n in VARIANTS},
                               shape, repeat) for clip in ("noise", "natural")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="1280x704x121", help="WxHxF")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--client-python", help="time the decodes again under this Python (ComfyUI's PyAV)")
    parser.add_argument("--time-only", action="store_true", help="only time the cached MP4s; print JSON")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    shape = tuple(int(v) for v in args.shape.split("x"))
    if args.time_only:
        print(json.dumps(timings(shape, args.repeat)))
        return 0
    result: dict[str, Any] = {
        "command": " ".join([os.path.relpath(sys.executable, ROOT), *sys.argv]),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": sys.version.split()[0]},
        "made_by": MADE_BY, "encode_s_note": "worker's encode_s is the session on CPU torch (float chunks in, "
        "quantized on CPU); on a GPU the quantize runs on device and the encode overlaps the VAE decode",
        "shape_wxhxf": args.shape, "repeat": args.repeat, "fps": FPS,
        "clips": build(shape), "decode_here": timings(shape, args.repeat)}
    if args.client_python:
        child = subprocess.run([args.client_python, __file__, "--time-only", "--shape", args.shape,
                                "--repeat", str(args.repeat)], check=True, capture_output=True, text=True)
        result["decode_client_python"] = json.loads(child.stdout.strip().splitlines()[-1])
    text = json.dumps(result, indent=1)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
