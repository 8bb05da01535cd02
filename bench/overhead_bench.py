"""Our overhead around the GPU, per job: client wall time minus the server's inference_time_s.

`inference_time_s` is the server's own task time (engine, VAE decode, MP4 encode, saving the
file); everything else a user waits for is ours or HTTP's: submit, noticing completion
(polling), the /content download and the MP4 -> IMAGE decode. Each job is run through our
VideoClient exactly as the Generate Video node runs it, and reported with that split. The decode
runs while the MP4 downloads (client/streamed_download.py): download_s is job done -> last byte,
decode_s what is left of the decode after it.

Levers measured in the same run (not assumed):
- poll modes: `fixed` (a poll every 0.25 s) against `due` (FAST_POLL_S polls once the
  supervisor's log shows the last denoise step; against a --url server: once the job has run
  90% of what the previous job of that shape took, the remote rule of nodes/progress.py);
  `due@0.02` is the due rule with another fast-poll interval (here 0.02 s, session 4's);
  `plain` is what the CLI with --url and a plain VideoClient.generate() get: no hint, the fast-poll
  window from what the earlier jobs of that shape took (client/poll_window.py); `fixed` forgets
  those times before each job;
- decode levers on each job's own MP4 bytes: decode_mp4 as shipped, with the per-frame scaler
  of before (PyAV's to_ndarray: a new SwsContext with a thread per core for every frame), its
  serial conversion (workers=0), PyAV decode alone, decode + rgb24, the float32 write alone,
  the PyAV thread modes; and whether the MP4's index (moov) comes before its data;
- download levers on the last measured job of each shape, kept on the server and fetched again
  from its /content (`download_levers`): the whole path MP4 -> IMAGE as shipped (decoded while it
  downloads, the index fetched first with a Range request, into a prepared output), the same
  with each decoder setting of SETTINGS changed (decoder threads x conversion workers, FRAME
  threading, the scaler of before: `setting_over_shipped` < 1 means that setting was faster on
  this machine, `best_setting` names the fastest), without the Range tail, the previous path
  (download, then decode), the download alone, and how long the decoder waited for bytes
  (`read_wait_s`; near 0: not download-bound, so parallel Range requests could not help);
- `--natural`: the same client path on a clip of smooth moving content of each shape, encoded
  with upstream's encoder settings (natural_clip), served as /content is (no GPU): what a real
  clip costs next to a random-weight model's noise.

On the stub (CPU) the MP4s are a few KB (its frames are flat blocks), so the download levers mean
something only against a real server's clips, or with bench/decode_bench.py --noise --stream
(random-weight-like clips served as upstream serves them).

Servers (the first two are launched and stopped by our Supervisor, as Local Server does):
    python bench/overhead_bench.py                                   # CPU: the stub server
    python bench/overhead_bench.py --model DIR [--gpus 0] [--server-cmd CMD]     # the real server
    python bench/overhead_bench.py --url http://127.0.0.1:8091 [--api-key-env VAR]
Common: --shapes 832x480x49,1280x704x121 --steps 4 --repeat 3 --poll-modes fixed,due
--lever-repeat 3 (0: no levers) --natural [--serve-python PY].
Interrupted (SIGINT, gpu_session.sh's time limit), it still prints what it measured ("interrupted").
The stub needs VLLM_OMNI_LAUNCHER_TEST_SERVER_PYTHON (the server venv's python).

JSON on stdout (one object: per-job rows, per shape and mode medians, levers); progress on stderr.
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import os
import platform
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from fractions import Fraction
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from gpu.common import import_package  # noqa: E402  (the bench's shared helpers)
STUB_MODEL = "Wan-AI/Wan2.2-TI2V-5B-Diffusers"
DEFAULT_SHAPES = "832x480x49,1280x704x121"
VLLM_MAIN = ("import sys; from vllm.entrypoints.cli.main import main; "
             "sys.argv[0] = 'vllm'; sys.exit(main())")
PASS_ENV = ("PYTHONPATH", "NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS")


def say(*parts: Any) -> None:
    print(*parts, file=sys.stderr, flush=True)


def parse_shapes(text: str) -> list[tuple[int, int, int]]:
    shapes = []
    for item in text.split(","):
        w, h, f = (int(x) for x in item.lower().split("x"))
        shapes.append((w, h, f))
    return shapes


def median(values: list[float]) -> Optional[float]:
    values = [v for v in values if v is not None]
    return round(statistics.median(values), 4) if values else None


# ----------------------------------------------------------------------------- the server
class Target:
    """Where jobs go: url, key, server version, and (for a supervised server) its progress."""

    def __init__(self, url: str, api_key: Optional[str], version: tuple[int, int], served: Optional[str],
                 progress: Optional[Callable[[], Any]] = None, stop: Optional[Callable[[], None]] = None,
                 info: Optional[dict[str, Any]] = None) -> None:
        self.url, self.api_key, self.version, self.served = url, api_key, version, served
        self.progress, self.stop, self.info = progress, stop, info or {}


def supervised(model: str, server_cmd: list[str], extra_env: dict[str, str], gpus: tuple[int, ...]) -> Target:
    from vllm_omni_launcher.server.config.local_config import LocalConfig
    from vllm_omni_launcher.server.launch.spec import LaunchSpec, RuntimeConfig
    from vllm_omni_launcher.server.supervision.supervisor import Supervisor

    spec = LaunchSpec(model, gpus=gpus, runtime=RuntimeConfig(enforce_eager=True))
    spec.validate()
    data_dir = tempfile.mkdtemp(prefix="vllm-omni-overhead-")
    config = LocalConfig(server_command=tuple(server_cmd), data_dir=data_dir, extra_env=extra_env,
                         startup_timeout_s=900)
    sup = Supervisor(spec, config)
    t0 = time.monotonic()
    say(f"starting {model} with our supervisor ({' '.join(server_cmd[:2])} ...)")
    sup.start(on_status=lambda st: say(f"  [{st.phase}] {st.text}"))
    ready_s = round(time.monotonic() - t0, 2)
    return Target(sup.url or "", sup.api_key, sup.server_version, spec.served_name, sup.progress, sup.stop,
                  {"mode": "supervised", "model": model, "ready_s": ready_s, "flags": spec.flags(),
                   "server_version": ".".join(map(str, sup.server_version))})


def remote(url: str, api_key_env: Optional[str]) -> Target:
    from vllm_omni_launcher.client.api import VideoClient

    key = os.environ.get(api_key_env) if api_key_env else None
    with VideoClient(url, api_key=key) as client:
        names = client.models()
    return Target(url.rstrip("/"), key, (0, 30), names[0] if names else None, info={"mode": "url", "url": url})


# ----------------------------------------------------------------------------- one job
def run_job(target: Target, shape: tuple[int, int, int], steps: int, fps: float, seed: int, mode: str,
            estimates: dict[tuple[int, int, int], float], keep_job: bool = False) -> tuple[dict[str, Any], bytes, Any]:
    from vllm_omni_launcher.client import poll_window as client_api     # the fast-poll window's module
    from vllm_omni_launcher.client.api import VideoClient, VideoRequest

    width, height, frames = shape
    req = VideoRequest("a red fox running through snow", width=width, height=height, num_frames=frames,
                       fps=fps, steps=steps, seed=seed)
    due: Optional[Callable[[], bool]] = None
    running = {"s": 0.0}
    rule, _, fast = mode.partition("@")        # "due@0.02": the due rule with 0.02 s fast polls
    if rule == "due" and target.progress is not None:
        last = target.progress()
        floor = last.run_id if last is not None else -1
        due = lambda: (lambda p: p is not None and p.denoised_after(floor))(target.progress())  # noqa: E731
    elif rule == "due" and shape in estimates:
        due = lambda: running["s"] >= 0.9 * estimates[shape]  # noqa: E731  (90 % of an earlier job's time)

    def on_update(update: Any) -> None:
        running["s"] = update.running_s

    if rule == "fixed":
        client_api.LEARNED.clear()     # really a poll every 0.25 s: no window from earlier jobs' times
    with VideoClient(target.url, api_key=target.api_key, served_name=target.served,
                     server_version=target.version) as client, \
            patched(client_api, "FAST_POLL_S", float(fast) if fast else client_api.FAST_POLL_S):
        result = client.generate(req, on_update=on_update, due=due, keep_job=keep_job)
    t = result.timings
    video = result.video
    inference = t.get("server_inference")
    row = {
        "shape": f"{width}x{height}x{frames}", "job_id": result.job_id, "steps": steps, "poll_mode": mode, "due_rule_used": due is not None,
        "wall_s": round(t["decoded"], 4), "inference_time_s": None if inference is None else round(inference, 4),
        "overhead_s": None if inference is None else round(t["decoded"] - inference, 4),
        "submit_s": round(t["submit"], 4),
        "detect_s": None if inference is None else round(t["job_done"] - t["submit"] - inference, 4),
        "download_s": round(t["downloaded"] - t["job_done"], 4),
        "decode_s": round(t["decoded"] - t["downloaded"], 4),
        "read_wait_s": round(t.get("read_wait", 0.0), 4), "fast_poll_s": float(fast) if fast else client_api.FAST_POLL_S,
        "queued_s": round(t.get("queued", 0.0), 4), "running_s": round(t.get("running", 0.0), 4),
        "mp4_bytes": len(result.mp4), "mp4_sha256": hashlib.sha256(result.mp4).hexdigest()[:16],
        "frames_shape": list(video.frames.shape), "dtype": str(video.frames.dtype), "fps": video.fps,
        "value_range": [round(float(video.frames.min()), 4), round(float(video.frames.max()), 4)],
    }
    estimates[shape] = t.get("running", 0.0)
    return row, result.mp4, req


# ----------------------------------------------------------------------------- decode levers
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


def _rgb24_per_frame_scaler(frame: Any, width: int, height: int) -> Any:
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
    "scaler_per_frame": {"scaler": _rgb24_per_frame_scaler},
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
        with patched(frames_mod, "_rgb24", _rgb24_per_frame_scaler):
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


# ----------------------------------------------------------------------------- natural content
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
                                        "scaler_per_frame": {"scaler": _rgb24_per_frame_scaler}})
    out["encoder"] = {"codec": "libx264", "pix_fmt": "yuv420p", **UPSTREAM_X264, "made_s": made_s}
    return out


# ----------------------------------------------------------------------------- main
def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--url", help="a running vLLM-Omni server (not started or stopped here)")
    where.add_argument("--server-cmd", help="the server program our Supervisor launches (with --model)")
    parser.add_argument("--model", default=None,
                        help="launch the real server for this model folder (program: --server-cmd, default this "
                             "python running vllm's CLI main); without --model and --url: the stub server")
    parser.add_argument("--gpus", default="0", help="GPUs for a launched server, e.g. 0 or 0,1")
    parser.add_argument("--api-key-env", default=None, help="environment variable holding the --url server's key")
    parser.add_argument("--shapes", default=DEFAULT_SHAPES, help="WxHxF list")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--fps", type=float, default=24.0)
    parser.add_argument("--repeat", type=int, default=3, help="measured jobs per shape and poll mode")
    parser.add_argument("--warmup", type=int, default=1, help="unmeasured jobs per shape first")
    parser.add_argument("--poll-modes", default="fixed,due")
    parser.add_argument("--lever-repeat", type=int, default=3, help="runs per decode lever (0: skip levers)")
    parser.add_argument("--stub-step-s", type=float, default=0.05, help="stub only: seconds per denoise step")
    parser.add_argument("--natural", action="store_true",
                        help="also time the client path on a natural-content clip of each shape (natural_clip), "
                             "served like /content by bench/mp4_file_server.py (no GPU)")
    parser.add_argument("--serve-python", default=sys.executable,
                        help="python with starlette + uvicorn for --natural (default: this one)")
    args = parser.parse_args()

    import_package()
    shapes = parse_shapes(args.shapes)
    modes = [m for m in args.poll_modes.split(",") if m]
    if args.url:
        target = remote(args.url, args.api_key_env)
    elif args.server_cmd or args.model:
        if not args.model:
            parser.error("--server-cmd needs --model")
        server_cmd = shlex.split(args.server_cmd) if args.server_cmd else [sys.executable, "-c", VLLM_MAIN]
        extra_env = {"HF_HUB_OFFLINE": "1", **{k: os.environ[k] for k in PASS_ENV if os.environ.get(k)}}
        target = supervised(args.model, server_cmd, extra_env, tuple(int(g) for g in args.gpus.split(",")))
    else:
        sys.path.insert(0, str(ROOT / "tests" / "contract"))
        import stubserver

        target = supervised(STUB_MODEL, [stubserver.server_python(), stubserver.STUB_SCRIPT],
                            {"VLLM_OMNI_STUB_STEP_S": str(args.stub_step_s)}, (0,))
        target.info["stub_step_s"] = args.stub_step_s

    report: dict[str, Any] = {
        "bench": "overhead", "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": " ".join(sys.argv), "server": target.info, "steps": args.steps,
        "env": {"python": platform.python_version(), "numpy": np.__version__, "cpus": os.cpu_count(),
                "machine": platform.machine()},
        "jobs": [], "summary": [], "levers": {}, "natural": {},
    }
    estimates: dict[tuple[int, int, int], float] = {}
    try:
        seed = 1
        for shape in shapes:
            for _ in range(args.warmup):
                run_job(target, shape, args.steps, args.fps, seed, "fixed", estimates)
                seed += 1
            lever_input: Optional[tuple[bytes, Any]] = None
            kept: Optional[dict[str, Any]] = None
            runs = [mode for _ in range(args.repeat) for mode in modes]   # interleaved: drift hits all alike
            for i, mode in enumerate(runs):
                last = i == len(runs) - 1 and args.lever_repeat > 0   # kept on the server for the download levers
                row, mp4, req = run_job(target, shape, args.steps, args.fps, seed, mode, estimates, keep_job=last)
                seed += 1
                report["jobs"].append(row)
                lever_input = lever_input or (mp4, req)
                kept = row if last else kept
                say(f"{row['shape']} {mode:>5}: wall {row['wall_s']:.3f} s, inference "
                    f"{row['inference_time_s']} s, overhead {row['overhead_s']} s (detect {row['detect_s']}, "
                    f"download {row['download_s']}, decode {row['decode_s']}, read wait {row['read_wait_s']})")
            for mode in modes:
                rows = [r for r in report["jobs"] if r["shape"] == "x".join(map(str, shape)) and r["poll_mode"] == mode]
                report["summary"].append({"shape": rows[0]["shape"], "poll_mode": mode, "jobs": len(rows), **{
                    f"median_{k}": median([r[k] for r in rows])
                    for k in ("wall_s", "inference_time_s", "overhead_s", "submit_s", "detect_s", "download_s",
                              "decode_s", "read_wait_s")}})
            if kept is not None and lever_input is not None:
                key = "x".join(map(str, shape))
                try:
                    report["levers"][key] = levers(*lever_input, args.lever_repeat)
                    report["levers"][key]["download"] = download_levers(
                        target.url, target.api_key, kept["job_id"], lever_input[1].bounds(), args.lever_repeat,
                        tuple(kept["frames_shape"][:3]))
                finally:
                    from vllm_omni_launcher.client.api import VideoClient

                    with VideoClient(target.url, api_key=target.api_key) as client:
                        client.delete(kept["job_id"])
                say(f"{key} download levers: {json.dumps(report['levers'][key]['download'])}")
        if target.stop is not None:
            target.stop()                      # the natural clips need no server, and no GPU
            target.stop = None
        if args.natural:
            for shape in shapes:
                key = "x".join(map(str, shape))
                try:
                    report["natural"][key] = natural_levers(shape, max(1, args.lever_repeat), args.serve_python)
                except Exception as exc:  # noqa: BLE001 - a data point less; the jobs' numbers still print
                    report["natural"][key] = {"error": f"{type(exc).__name__}: {exc}"}
                say(f"{key} natural content: {json.dumps(report['natural'][key])}")
    except KeyboardInterrupt:                  # gpu_session.sh's timeout: keep what was measured
        report["interrupted"] = True
        say("interrupted: reporting what was measured")
    except Exception as exc:  # noqa: BLE001 - one device run: what was measured still prints
        report["error"] = f"{type(exc).__name__}: {exc}"
        say(f"failed: {report['error']}; reporting what was measured")
    finally:
        if target.stop is not None:
            target.stop()
    print(json.dumps(report, indent=1))
    return 1 if "error" in report else 0


if __name__ == "__main__":
    raise SystemExit(main())
