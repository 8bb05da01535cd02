"""The start image's cost per job on CPU: sent at its own size (before) against sent at the request's size
(now), in the same run on one machine.

A phone photo as a ComfyUI IMAGE (float32 [1, H, W, 3]: gradients and grain, so its PNG is as large as a
photo's) goes up as the `input_reference` PNG, and vLLM-Omni 0.30 decodes it as RGB and stretches it to the
request's width x height with Pillow LANCZOS, only where the size differs (video_api_utils.py:122-126,
serving_video.py:351-363). Timed per job, medians of --repeat runs:

- `before`: client.images.image_to_png(picture) (uint8 conversion, block averages over 4096x4096, PNG of
  the whole picture), then the server's part: PNG decode + RGB + LANCZOS to the request's size;
- `now`: image_to_png(picture, (width, height)) (the same conversion, LANCZOS here, a small PNG), then the
  server's part: PNG decode + RGB, no resize (the size matches).

Both end in the same pixels (checked here; the server's own code: tests/contract/
test_start_image_sent_at_request_size_upstream.py). The upload itself is not timed (it depends on the
link); its bytes are reported.

    .venv/bin/python -m bench.start_image_upload [--repeat 3] [--out PATH]
    .venv/bin/python bench/start_image_upload.py --out bench/results/cpu-start-image-at-request-size.json

Prints a table and writes bench/out/start_image_upload.json (or --out).
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
from pathlib import Path
from typing import Any, Callable

import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from gpu.common import import_package  # noqa: E402

import_package()
from vllm_omni_launcher.client.images import image_to_png  # noqa: E402

PICTURES = {"12 MP (4000x3000)": (3000, 4000), "24 MP (6000x4000)": (4000, 6000)}   # name: (height, width)
SIZES = {"I2V-A14B 832x480": (832, 480), "TI2V-5B 1280x704": (1280, 704)}


def phone_photo(height: int, width: int) -> np.ndarray:
    """A ComfyUI IMAGE of a photo: float32 [1, H, W, 3], smooth gradients plus sensor-like grain."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    photo = np.stack([0.5 + 0.5 * np.sin(x / 37 + y / 53), (x / width) ** 2, 0.5 + 0.5 * np.cos(y / 29)], -1)
    photo += np.random.default_rng(0).standard_normal(photo.shape, dtype=np.float32) * np.float32(0.03)
    return photo[None]


def server_side(png: bytes, size: tuple[int, int]) -> Image.Image:
    """What vLLM-Omni 0.30 does with the upload before the pipeline: decode as RGB, LANCZOS where the size differs."""
    with Image.open(io.BytesIO(png)) as decoded:
        picture = decoded.convert("RGB")
    return picture if picture.size == size else picture.resize(size, Image.Resampling.LANCZOS)


def timed(call: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = call()
    return time.perf_counter() - t0, out


def one_path(picture: np.ndarray, size: tuple[int, int], at_request_size: bool) -> dict[str, Any]:
    client_s, png = timed(lambda: image_to_png(picture, size if at_request_size else None))
    server_s, result = timed(lambda: server_side(png, size))
    return {"client_s": client_s, "server_s": server_s, "total_s": client_s + server_s, "png_bytes": len(png),
            "pixels": np.asarray(result)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--out", default=str(ROOT / "bench" / "out" / "start_image_upload.json"))
    a = p.parse_args()
    rows = []
    for picture_name, (height, width) in PICTURES.items():
        picture = phone_photo(height, width)
        for size_name, size in SIZES.items():
            runs: dict[str, list[dict[str, Any]]] = {"before": [], "now": []}
            for _ in range(a.repeat):                       # alternated, so both see the same machine state
                runs["before"].append(one_path(picture, size, at_request_size=False))
                runs["now"].append(one_path(picture, size, at_request_size=True))
            same = all(np.array_equal(b["pixels"], n["pixels"]) for b, n in zip(runs["before"], runs["now"]))
            median = {path: {key: statistics.median(r[key] for r in rs) for key in ("client_s", "server_s", "total_s")}
                      for path, rs in runs.items()}
            rows.append({"picture": picture_name, "request": size_name, "same_pixels": same,
                         "png_bytes": {path: rs[0]["png_bytes"] for path, rs in runs.items()},
                         "median_s": median,
                         "ratio_now_over_before": median["now"]["total_s"] / median["before"]["total_s"]})
            print(f"{picture_name:18} {size_name:17} before {median['before']['total_s']:6.2f}s "
                  f"({rows[-1]['png_bytes']['before'] / 1e6:5.1f} MB PNG)  now {median['now']['total_s']:5.2f}s "
                  f"({rows[-1]['png_bytes']['now'] / 1e6:4.2f} MB)  ratio {rows[-1]['ratio_now_over_before']:.3f}  "
                  f"same pixels: {same}", flush=True)
        del picture
    command = " ".join(["python", os.path.relpath(sys.argv[0], ROOT), *sys.argv[1:]])
    report = {"command": command, "repeat": a.repeat, "rows": rows,
              "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                          "python": platform.python_version(), "pillow": Image.__version__}}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {a.out}")
    return 0 if all(row["same_pixels"] for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
