"""Issue 25's node overhead: would NVDEC (PyAV's `hwaccel`, device type cuda) decode the server's MP4 into the
IMAGE array faster than the CPU decode the node uses? Both in the same run, on the same clips.

The node's seconds beyond the CLI's are the decode of the MP4 into the float32 IMAGE (bench/results/
cpu-node-overhead/): on a 16-core box ~0.25-0.29 s for the 67 MB noise clip of a random-weight TI2V-5B at
1280x704x121, which keeps the node above 0.3 s. PyAV 18's wheels carry FFmpeg with the cuda hw device; the GPU
box's ComfyUI venv has that wheel. Each path: bytes -> float32 [F, H, W, 3] in 0..1.

  cpu:   client.frames.decode_mp4 (what the node runs; FFmpeg's frame threads, our float32 write)
  nvdec: av.open(..., hwaccel=HWAccel("cuda")), frames copied back by FFmpeg, to_ndarray("rgb24"), the same
         float32 write (the first open also pays CUDA's initialisation: reported apart as `nvdec_first_s`)

Clips: the noise clip (bench/decode_bench.make_noise_clip, crf 14, ~59 MB: a random-weight model's) and a smooth
one (decode_bench.make_clip: a real video's size class). Also reported: whether both paths give the same frames
(max abs difference of the float arrays; H.264 decoders are bit-exact, the colour conversion may differ by 1/255).

Is the CPU decode at the box's limit, or at frame threading's? On the noise clip, also:
  cpu threads N:  decode_mp4 with N decoder threads (1, 4, 8, 16): how FFmpeg's frame threading scales here
                  (on 2 cores, 1 -> 2 threads was 1.93x; the 16-core box decoded ~4x faster than one core)
  gop split KxT:  the same noise encoded with a keyframe every GOP frames (libx264 `g`, which a request's
                  `video_codec_options` can ask vLLM-Omni for), its GOPs decoded by K decoders of T threads at
                  once, the same float32 write; beside `cpu` on that clip (`gop_clip_cpu`) and its size
If a split runs well past frame threading's best, the launcher could ask the server for keyframes and decode
the GOPs at once; if not, the CPU decode is at the box's limit.

    <ComfyUI venv python> bench/nvdec_decode.py [--repeat 5] [--out bench/out/nvdec_decode.json]

Without a usable cuda device the nvdec rows say why and the cpu rows still come out (CPU rehearsal).
"""
from __future__ import annotations

import argparse
import io
import json
import os
import platform
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

import av
import numpy as np

import decode_bench  # noqa: E402  (bench/ on sys.path: run as a script)
from vllm_omni_launcher.client.frames import decode_mp4  # noqa: E402  (decode_bench imported the package)

SCALE = np.float32(1.0 / 255.0)


def nvdec_decode(data: bytes) -> np.ndarray:
    """The clip through NVDEC, copied back and converted as the CPU path converts."""
    from av.codec.hwaccel import HWAccel

    with av.open(io.BytesIO(data), format="mp4", hwaccel=HWAccel(device_type="cuda", allow_software_fallback=False)) \
            as container:
        stream = container.streams.video[0]
        count, height, width = stream.frames, stream.codec_context.height, stream.codec_context.width
        out = np.empty((count, height, width, 3), dtype=np.float32)
        i = 0
        for frame in container.decode(stream):
            np.multiply(frame.to_ndarray(format="rgb24"), SCALE, out=out[i], casting="unsafe")
            i += 1
    return out[:i]


def cpu_decode(data: bytes, threads: int = 0) -> np.ndarray:
    return decode_mp4(data, threads=threads).frames


def gop_split_decode(data: bytes, decoders: int, threads: int) -> np.ndarray:
    """Every GOP (a keyframe and the frames up to the next) decoded on its own decoder, `decoders` at once."""
    with av.open(io.BytesIO(data), format="mp4") as container:
        stream = container.streams.video[0]
        count, height, width = stream.frames, stream.codec_context.height, stream.codec_context.width
        extradata = stream.codec_context.extradata
        gops: list[list[Any]] = []
        for packet in container.demux(stream):
            if packet.size:
                if packet.is_keyframe or not gops:
                    gops.append([])
                gops[-1].append(packet)
    out = np.empty((count, height, width, 3), dtype=np.float32)
    starts = [sum(len(g) for g in gops[:i]) for i in range(len(gops))]   # no B-frames: decode order is display order

    def one(i: int) -> int:
        codec = av.CodecContext.create("h264", "r")
        codec.extradata = extradata
        codec.thread_type, codec.thread_count = "AUTO", threads
        n = starts[i]
        for packet in [*gops[i], None]:
            for frame in codec.decode(packet):
                np.multiply(frame.to_ndarray(format="rgb24"), SCALE, out=out[n], casting="unsafe")
                n += 1
        return n - starts[i]

    with ThreadPoolExecutor(decoders) as pool:
        decoded = sum(pool.map(one, range(len(gops))))
    return out[:decoded]


def scaling(noise: bytes, shape: tuple[int, int, int], repeat: int, gop: int) -> dict[str, Any]:
    """The thread curve of the shipped decode, and GOP-split decodes of the same noise with keyframes."""
    width, height, frames = shape
    row: dict[str, Any] = {f"cpu_threads_{n}": timed(lambda d, n=n: cpu_decode(d, n), noise, repeat)
                           for n in (1, 4, 8, 16)}
    split = decode_bench.make_noise_clip(frames, width, height, 24, crf=14, gop=gop)
    row["gop"], row["gop_clip_mb"] = gop, round(len(split) / 1e6, 1)
    row["gop_clip_cpu"] = timed(cpu_decode, split, repeat)
    for decoders, threads in ((2, 8), (4, 4), (8, 2)):
        row[f"gop_split_{decoders}x{threads}"] = timed(lambda d, k=decoders, t=threads: gop_split_decode(d, k, t),
                                                       split, repeat)
    row["gop_split_max_abs_diff"] = float(np.abs(gop_split_decode(split, 4, 4) - cpu_decode(split)).max())
    return row


def timed(fn: Callable[[bytes], np.ndarray], data: bytes, repeat: int) -> dict[str, Any]:
    seconds, frames = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        frames = fn(data)
        seconds.append(time.perf_counter() - t0)
    return {"median_s": round(statistics.median(seconds), 4), "all_s": [round(s, 4) for s in seconds],
            "shape": list(frames.shape) if frames is not None else None}


def one_clip(name: str, data: bytes, repeat: int) -> dict[str, Any]:
    row: dict[str, Any] = {"clip": name, "mp4_mb": round(len(data) / 1e6, 1), "cpu": timed(cpu_decode, data, repeat)}
    try:
        t0 = time.perf_counter()
        first = nvdec_decode(data)
        row["nvdec_first_s"] = round(time.perf_counter() - t0, 4)
        row["nvdec"] = timed(nvdec_decode, data, repeat)
        row["max_abs_diff"] = float(np.abs(first - cpu_decode(data)).max())
        row["nvdec_over_cpu"] = round(row["nvdec"]["median_s"] / row["cpu"]["median_s"], 3)
    except Exception as exc:  # noqa: BLE001 - no cuda device here is a result too
        row["nvdec"] = f"unavailable: {type(exc).__name__}: {exc}"[:300]
    return row


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--shape", default="1280x704x121", help="WxHxF of both clips")
    p.add_argument("--gop", type=int, default=16, help="keyframe interval of the GOP-split clip")
    p.add_argument("--out", default=str(Path(__file__).resolve().parent / "out" / "nvdec_decode.json"))
    a = p.parse_args()
    width, height, frames = (int(x) for x in a.shape.split("x"))
    clips = {"noise": decode_bench.make_noise_clip(frames, width, height, 24, crf=14),
             "smooth": decode_bench.make_clip(frames, width, height, 24)}
    rows = [one_clip(name, data, a.repeat) for name, data in clips.items()]
    split = scaling(clips["noise"], (width, height, frames), a.repeat, a.gop)
    report = {"machine": platform.node(), "cpus": os.cpu_count(), "av": av.__version__,
              "shape": a.shape, "repeat": a.repeat, "rows": rows, "noise_scaling": split}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(report, indent=1))
    for row in rows:
        nv = row["nvdec"]
        print(f"NVDEC {row['clip']} {row['mp4_mb']} MB: cpu {row['cpu']['median_s']} s, nvdec "
              + (f"{nv['median_s']} s ({row['nvdec_over_cpu']}x cpu; first {row['nvdec_first_s']} s; max diff "
                 f"{row['max_abs_diff']:.4f})" if isinstance(nv, dict) else nv), flush=True)
    print("SCALING noise: " + ", ".join(f"{k} {v['median_s']} s" for k, v in split.items() if isinstance(v, dict))
          + f"; gop clip {split['gop_clip_mb']} MB (g={split['gop']}), split max diff "
          f"{split['gop_split_max_abs_diff']:.4f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
