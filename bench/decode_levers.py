"""MP4 -> IMAGE levers, each timed against the path as shipped in the same run (bench/overhead_bench.py,
bench/decode_bench.py): decode levers on a clip's own bytes (the per-frame scaler of before, serial
conversion, PyAV decode alone, decode + rgb24, the float32 write alone, thread modes; whether the index
comes first) and download levers against a server's /content (decoded while it downloads, each decoder
setting of SETTINGS changed, no Range tail, download then decode, the download alone), with
`served_mp4` serving a clip the way vLLM-Omni serves /content. A lever is the shipped code with one thing
changed (`patched`), never a copy of it.
"""
from __future__ import annotations

import contextlib
import io
import os
import socket
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def median(values: list[float]) -> Optional[float]:
    values = [v for v in values if v is not None]
    return round(statistics.median(values), 4) if values else None



def moov_before_mdat(data: bytes) -> Optional[bool]:
    """True when the MP4's index precedes its media data (a "faststart" file)."""
    pos = 0
    while pos + 8 <= len(data):
        size = int.from_bytes(data[pos:pos + 4], "big")
        kind = data[pos + 4:pos + 8]
        if kind in (b"moov", b"mdat"):
            return kind == b"moov"
        if size == 1 and pos + 16 <= len(data):
            size = int.from_bytes(data[pos + 8:pos + 16], "big")
        if size < 8:
            return None
        pos += size
    return None


def _pyav_pass(data: bytes, thread_type: str, convert: Optional[str]) -> int:
    import av

    count = 0
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.video[0]
        stream.thread_type = thread_type
        stream.codec_context.thread_count = 0
        for frame in container.decode(stream):
            if convert is not None:
                frame.to_ndarray(format=convert)
            count += 1
    return count


def _float_write(shape: tuple[int, ...]) -> None:
    """The float32 write of a whole clip into fresh memory (page faults included), serial."""
    src = np.full(shape[1:], 128, np.uint8)
    out = np.empty(shape, np.float32)
    scale = np.float32(1 / 255)
    for i in range(shape[0]):
        np.multiply(src, scale, out=out[i])


@contextlib.contextmanager
def patched(module: Any, name: str, value: Any) -> Iterator[None]:
    """`module.name = value` for the block (a bench lever: the shipped code with one thing changed)."""
    old = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, old)


def rgb24_per_frame_scaler(frame: Any, width: int, height: int) -> Any:
    """The rgb24 conversion before session 5: PyAV's to_ndarray, i.e. a new SwsContext per frame
    with PyAV's default swscale threads=0 (one slice thread per core)."""
    size = {} if frame.width == width and frame.height == height else {"width": width, "height": height}
    return frame.to_ndarray(format="rgb24", **size)


# Decoder settings measured side by side on the shipped path (streamed, prepared output): decoder
# threads (0 = FFmpeg's auto: cores + 1, at most 16), conversion workers (default min(8, cores)),
# PyAV thread_type, FFmpeg's read size from our buffer (32 KiB: ~1700 Python reads for a 55 MB
# clip; 256 KiB is the download's chunk, the most one read returns), and the scaler of before (a
# lever that patches frames._rgb24).
SETTINGS: dict[str, dict[str, Any]] = {
    "shipped": {},
    "thread_type_frame": {"thread_type": "FRAME"},
    "workers2": {"workers": 2},
    "workers4": {"workers": 4},
    "threads12_workers4": {"threads": 12, "workers": 4},
    "threads12_workers8": {"threads": 12, "workers": 8},
    "threads8_workers4": {"threads": 8, "workers": 4},
    "threads8_workers8": {"threads": 8, "workers": 8},
    "avio_buffer_256k": {"buffer_size": 256 << 10},
    "scaler_per_frame": {"scaler": rgb24_per_frame_scaler},
}


def download_levers(url: str, api_key: Optional[str], job_id: str, bounds: Any, repeat: int,
                    shape: tuple[int, int, int], settings: Optional[dict[str, dict[str, Any]]] = None) -> dict[str, Any]:
    """GET /v1/videos/{job_id}/content again and again, MP4 -> IMAGE each way (interleaved):
    `streamed_prepared` (shipped, as generate() runs it once the job is due: decoded while it
    downloads, Range tail for the index, into an output array of `shape` (frames, height, width)
    made beforehand, which is not timed: it is made while the GPU finishes), then the same with
    each of `settings` (default SETTINGS) changed (`setting:<name>`), `streamed` (shipped into
    fresh memory), `streamed_no_tail`, `download_then_decode` (session 3: whole body, then
    decode_mp4) and `download_only`. `read_wait_s`: how long the shipped decoder waited for bytes
    (median): near 0 means the decode is not download-bound, so more connections for the body
    (parallel Range requests) could not make it faster."""
    from vllm_omni_launcher.client import frames as frames_mod
    from vllm_omni_launcher.client.frames import PreparedOutput, decode_mp4
    from vllm_omni_launcher.client.streamed_download import download_decoding
    from vllm_omni_launcher.client.transport import Transport

    path = f"/v1/videos/{job_id}/content"
    waits: list[float] = []

    def download(http: Any) -> bytes:
        return http.request("GET", path, what="download", large_body=True, max_body=bounds.max_bytes).body

    def streamed(http: Any, tail: bool, into: Any = None, scaler: Any = None, **tuning: Any) -> Any:
        with patched(frames_mod, "_rgb24", scaler or frames_mod._rgb24):
            got = download_decoding(http, path, what="download", job_id=job_id, max_bytes=bounds.max_bytes,
                                    cap_reason="", bounds=bounds, tail=tail, into=into, **tuning)
        return got

    prepared: dict[str, Any] = {}

    def shipped(http: Any) -> Any:
        got = streamed(http, True, prepared.pop("array"))
        waits.append(got.read_wait_s)
        return got

    cases: dict[str, Callable[[Any], Any]] = {"streamed_prepared": shipped}
    for name, tuning in (SETTINGS if settings is None else settings).items():
        if name != "shipped":
            cases[f"setting:{name}"] = lambda http, t=tuning: streamed(http, True, prepared.pop("array"), **t)
    cases.update({
        "streamed": lambda http: streamed(http, True),
        "streamed_no_tail": lambda http: streamed(http, False),
        "download_then_decode": lambda http: decode_mp4(download(http), bounds=bounds),
        "download_only": download,
    })
    times: dict[str, list[float]] = {name: [] for name in cases}
    with Transport(url, api_key) as http:
        size = len(download(http))                 # warm: connection, page cache
        streamed(http, True)                       # warm: the decode path (imports, first-touch pools)
        for _ in range(repeat):
            for name, fn in cases.items():
                if name == "streamed_prepared" or name.startswith("setting:"):
                    prepared["array"] = PreparedOutput(*shape).take()
                t = time.perf_counter()
                result = fn(http)
                times[name].append(time.perf_counter() - t)
                del result
    med = {k: median(v) for k, v in times.items()}
    out: dict[str, Any] = {"mp4_bytes": size, "cpus": os.cpu_count(), "median_s": med,
                           "min_s": {k: round(min(v), 4) for k, v in times.items()},
                           "read_wait_s": median(waits)}
    ours = med["streamed_prepared"]
    if ours:
        out["before_over_shipped"] = round(med["download_then_decode"] / ours, 3)
        out["fresh_over_prepared"] = round(med["streamed"] / ours, 3)
        out["no_tail_over_streamed"] = round(med["streamed_no_tail"] / med["streamed"], 3)
        # the lever table: each setting's time over the shipped one (< 1: that setting was faster here)
        out["setting_over_shipped"] = {k.split(":", 1)[1]: round(v / ours, 3) for k, v in med.items()
                                       if k.startswith("setting:") and v}
        best = min(out["setting_over_shipped"].items(), key=lambda kv: kv[1], default=None)
        out["best_setting"] = best[0] if best is not None and best[1] < 1.0 else "shipped"
    if med["download_only"]:
        out["download_mb_per_s"] = round(size / med["download_only"] / 1e6, 1)
    return out


def levers(data: bytes, req: Any, repeat: int) -> dict[str, Any]:
    from vllm_omni_launcher.client import frames as frames_mod
    from vllm_omni_launcher.client.frames import decode_mp4

    bounds = req.bounds()
    video = decode_mp4(data, bounds=bounds)
    shape = video.frames.shape
    del video

    def per_frame_scaler() -> Any:
        with patched(frames_mod, "_rgb24", rgb24_per_frame_scaler):
            return decode_mp4(data, bounds=bounds)

    cases: dict[str, Callable[[], Any]] = {
        "decode_mp4": lambda: decode_mp4(data, bounds=bounds),
        "decode_mp4_scaler_per_frame": per_frame_scaler,
        "decode_mp4_serial_convert": lambda: decode_mp4(data, bounds=bounds, workers=0),
        "pyav_decode_only_auto": lambda: _pyav_pass(data, "AUTO", None),
        "pyav_decode_only_slice": lambda: _pyav_pass(data, "SLICE", None),
        "pyav_decode_rgb24_auto": lambda: _pyav_pass(data, "AUTO", "rgb24"),
        "float32_write_only": lambda: _float_write(shape),
    }
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(repeat):               # interleaved, so drift hits every case alike
        for name, fn in cases.items():
            t = time.perf_counter()
            result = fn()
            times[name].append(time.perf_counter() - t)
            del result
    out: dict[str, Any] = {"moov_before_mdat": moov_before_mdat(data), "cpus": os.cpu_count(),
                           "mp4_bytes": len(data), "median_s": {k: median(v) for k, v in times.items()}}
    med = out["median_s"]
    ours = med["decode_mp4"]
    if ours:
        out["serial_over_shipped"] = round(med["decode_mp4_serial_convert"] / ours, 3)
        out["scaler_per_frame_over_shipped"] = round(med["decode_mp4_scaler_per_frame"] / ours, 3)
    floor = med["pyav_decode_rgb24_auto"]
    if floor and ours:
        out["shipped_over_decode_rgb24"] = round(ours / floor, 3)
    return out



@contextlib.contextmanager
def served_mp4(data: bytes, python: str) -> Iterator[str]:
    """`data` served the way vLLM-Omni serves /content (bench/mp4_file_server.py, Starlette
    FileResponse under uvicorn on 127.0.0.1, run by `python`); yields the base URL."""
    with tempfile.TemporaryDirectory(prefix="vllm-omni-bench-mp4-") as tmp:
        path = Path(tmp) / "clip.mp4"
        path.write_bytes(data)
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        server = subprocess.Popen([python, str(ROOT / "bench" / "mp4_file_server.py"), str(path), str(port)])
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    break
                except OSError:
                    if server.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(f"{python} bench/mp4_file_server.py did not start (needs starlette "
                                           "and uvicorn: the server venv's python has both)") from None
                    time.sleep(0.1)
            yield f"http://127.0.0.1:{port}"
        finally:
            server.terminate()
            server.wait(10)

