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


def cpu_decode(data: bytes) -> np.ndarray:
    return decode_mp4(data).frames


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
    p.add_argument("--out", default=str(Path(__file__).resolve().parent / "out" / "nvdec_decode.json"))
    a = p.parse_args()
    width, height, frames = (int(x) for x in a.shape.split("x"))
    clips = {"noise": decode_bench.make_noise_clip(frames, width, height, 24, crf=14),
             "smooth": decode_bench.make_clip(frames, width, height, 24)}
    rows = [one_clip(name, data, a.repeat) for name, data in clips.items()]
    report = {"machine": platform.node(), "cpus": os.cpu_count(), "av": av.__version__,
              "shape": a.shape, "repeat": a.repeat, "rows": rows}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(report, indent=1))
    for row in rows:
        nv = row["nvdec"]
        print(f"NVDEC {row['clip']} {row['mp4_mb']} MB: cpu {row['cpu']['median_s']} s, nvdec "
              + (f"{nv['median_s']} s ({row['nvdec_over_cpu']}x cpu; first {row['nvdec_first_s']} s; max diff "
                 f"{row['max_abs_diff']:.4f})" if isinstance(nv, dict) else nv), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
