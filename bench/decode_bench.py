"""MP4 -> IMAGE array: client.frames.decode_mp4 against the floor, in the same run.

The floor is what any decoder must do: PyAV decode (same threading) + rgb24 conversion +
one float32 write per frame into a preallocated [F, H, W, 3] array. The goal is
decode_mp4 <= 1.5x the floor. A naive list-of-frames + np.stack decoder is timed too, for
reference. Clips are made here with PyAV (H.264 yuv420p, preset ultrafast like vLLM-Omni)
from tests/contract/frame_code frames, so they decode to known content.

`--noise WxHxF` adds a clip like a random-weight model's: 2x2-pixel noise (+-72 around grey)
with vLLM-Omni's encoder settings (libx264, preset ultrafast, crf 18), about 450 KB a frame
(the real server's 1280x704x121 clip from random weights was 54.6 MB). `--stream` then serves
each clip the way vLLM-Omni serves /content (bench/mp4_file_server.py: Starlette FileResponse
under uvicorn on 127.0.0.1, started with --serve-python) and times the download levers of
decode_levers.download_levers: decoded while it downloads (shipped) against download, then
decode (before).

    .venv/bin/python bench/decode_bench.py [--repeat 5] [--quick]
    .venv/bin/python bench/decode_bench.py --noise 1280x704x121 --stream --serve-python .venv-server/bin/python

Prints a table and writes bench/out/decode_bench.json.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import platform
import statistics
import sys
import time
from fractions import Fraction
from pathlib import Path

import av
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "contract"))
sys.path.insert(0, str(ROOT / "bench"))
import decode_levers  # noqa: E402
import frame_code  # noqa: E402
from gpu.common import import_package  # noqa: E402

import_package()
from vllm_omni_launcher.client.bounds import bounds_for  # noqa: E402
from vllm_omni_launcher.client.frames import decode_mp4  # noqa: E402

NOISE_AMPLITUDE = 72

CASES = [  # name, frames, width, height, fps
    ("ti2v_5b 121x1280x704@24", 121, 1280, 704, 24),
    ("a14b 81x1280x720@16", 81, 1280, 720, 16),
]
QUICK_CASES = [("quick 17x320x192@16", 17, 320, 192, 16)]


def make_clip(count: int, width: int, height: int, fps: int, seed: int = 1234) -> bytes:
    buf = io.BytesIO()
    with av.open(buf, "w", format="mp4") as out:
        stream = out.add_stream("libx264", rate=Fraction(fps))
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.options = {"preset": "ultrafast"}
        for i in range(count):
            # frame_code blocks plus mild noise so the codec has real work to do
            base = frame_code.encode(i, seed, width, height).astype(np.int16)
            noise = np.random.default_rng(i).integers(-12, 13, size=(height, width, 1), dtype=np.int16)
            frame = av.VideoFrame.from_ndarray(np.clip(base + noise, 0, 255).astype(np.uint8), format="rgb24")
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return buf.getvalue()


def make_noise_clip(count: int, width: int, height: int, fps: int, seed: int = 1234, crf: int = 18,
                    gop: int = 0) -> bytes:
    """A random-weight model's kind of clip, with vLLM-Omni's encoder settings (see the docstring); a lower
    `crf` makes it larger (bench/node_overhead.py: 14, 59 MB at 1280x704x121, near the H100 clip's 67 MB).
    `gop`: a keyframe every `gop` frames (libx264's `g`, which a request's `video_codec_options` can set);
    0 keeps the encoder's own (one keyframe in a Wan clip)."""
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    with av.open(buf, "w", format="mp4") as out:
        stream = out.add_stream("libx264", rate=Fraction(fps))
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.options = {"preset": "ultrafast", "crf": str(crf), "threads": "0", **({"g": str(gop)} if gop else {})}
        for _ in range(count):
            small = rng.integers(128 - NOISE_AMPLITUDE, 128 + NOISE_AMPLITUDE, size=(height // 2, width // 2, 3),
                                 dtype=np.int16).astype(np.uint8)
            frame = np.ascontiguousarray(np.repeat(np.repeat(small, 2, 0), 2, 1))
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return buf.getvalue()


def stream_levers(data: bytes, count: int, width: int, height: int, python: str, repeat: int) -> dict:
    """decode_levers.download_levers against bench/mp4_file_server.py serving `data`."""
    with decode_levers.served_mp4(data, python) as url:
        return decode_levers.download_levers(url, None, "bench", bounds_for(width, height, count, {}), repeat,
                                             (count, height, width))


def floor_decode(data: bytes) -> np.ndarray:
    """PyAV decode + rgb24 + one fused float32 write into a preallocated array."""
    scale = np.float32(1 / 255)
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.video[0]
        stream.thread_type = "AUTO"
        out = np.empty((stream.frames, stream.codec_context.height, stream.codec_context.width, 3), np.float32)
        for i, frame in enumerate(container.decode(stream)):
            np.multiply(frame.to_ndarray(format="rgb24"), scale, out=out[i])
    return out


def naive_decode(data: bytes) -> np.ndarray:
    """The common pattern: list of uint8 frames, np.stack, then convert (2-3x memory)."""
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.video[0]
        stream.thread_type = "AUTO"
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(stream)]
    return np.stack(frames).astype(np.float32) / 255.0


def timed(fn, data: bytes, repeat: int) -> list[float]:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        result = fn(data)
        times.append(time.perf_counter() - t)
        del result
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="one small clip (smoke test)")
    parser.add_argument("--no-naive", action="store_true", help="skip the list+stack reference")
    parser.add_argument("--noise", default=None, metavar="WxHxF",
                        help="add random-weight-like noise clips of these shapes (e.g. 832x480x49,1280x704x121)")
    parser.add_argument("--only-noise", action="store_true", help="with --noise: skip the other clips")
    parser.add_argument("--stream", action="store_true",
                        help="also time the download levers against a local FileResponse server")
    parser.add_argument("--serve-python", default=sys.executable,
                        help="python with starlette + uvicorn for --stream (default: this one)")
    parser.add_argument("--out", default=str(ROOT / "bench" / "out" / "decode_bench.json"))
    args = parser.parse_args()

    cases = [] if args.only_noise else [(*case, False) for case in (QUICK_CASES if args.quick else CASES)]
    for shape in filter(None, (args.noise or "").split(",")):
        width, height, count = (int(x) for x in shape.lower().split("x"))
        cases.append((f"noise {count}x{width}x{height}@24", count, width, height, 24, True))
    rows = []
    for name, count, width, height, fps, noise in cases:
        data = (make_noise_clip if noise else make_clip)(count, width, height, fps)
        check = decode_mp4(data)
        assert check.frames.shape == (count, height, width, 3) and check.fps == fps
        if noise:
            assert np.array_equal(check.frames, floor_decode(data)), "decode_mp4 differs from the floor"
        else:
            assert [frame_code.decode(f) for f in check.frames[:3]] == [(i, 1234 % 256) for i in range(3)]
        del check
        # warm-up: first touch of fresh memory is much slower on some VMs; keep both sides fair
        floor_decode(data)
        ours, floor = [], []
        for _ in range(args.repeat):  # interleave so drift hits both equally
            ours += timed(lambda d: decode_mp4(d).frames, data, 1)
            floor += timed(floor_decode, data, 1)
        naive = [] if args.no_naive else timed(naive_decode, data, max(1, args.repeat // 2))
        row = {
            "case": name, "frames": count, "width": width, "height": height, "mp4_bytes": len(data),
            "output_bytes": count * width * height * 3 * 4,
            "ours_s": {"min": min(ours), "median": statistics.median(ours), "all": ours},
            "floor_s": {"min": min(floor), "median": statistics.median(floor), "all": floor},
            "ratio_median": statistics.median(ours) / statistics.median(floor),
            "ratio_min": min(ours) / min(floor),
        }
        if naive:
            row["naive_s"] = {"min": min(naive), "median": statistics.median(naive), "all": naive}
        if args.stream:
            row["download"] = stream_levers(data, count, width, height, args.serve_python, args.repeat)
            print(f"{name}: download levers {json.dumps(row['download'])}", flush=True)
        rows.append(row)

    print(f"\n{'case':<26}{'out MB':>8}{'ours s':>9}{'floor s':>9}{'ratio':>7}{'naive s':>9}   (median of {args.repeat})")
    for r in rows:
        naive = f"{r['naive_s']['median']:9.3f}" if "naive_s" in r else f"{'-':>9}"
        print(f"{r['case']:<26}{r['output_bytes'] / 1e6:8.0f}{r['ours_s']['median']:9.3f}"
              f"{r['floor_s']['median']:9.3f}{r['ratio_median']:7.2f}{naive}")
    worst = max(r["ratio_median"] for r in rows)
    print(f"goal <= 1.50x floor: {'met' if worst <= 1.5 else 'NOT met'} (worst {worst:.2f}x)")

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "bench": "decode_mp4", "command": " ".join(["bench/decode_bench.py", *sys.argv[1:]]),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "goal_ratio": 1.5, "worst_ratio": worst, "rows": rows,
        "env": {"python": platform.python_version(), "numpy": np.__version__, "av": av.__version__,
                "cpus": os.cpu_count(), "machine": platform.machine()},
    }, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
