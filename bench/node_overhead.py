"""Issue 25 on CPU: where the Generate Video node's seconds beyond the server's go, against the CLI's, per job.

Both paths run here against one server (bench/node_overhead_server.py: a job API whose jobs take --job-s, and
whose /content is a noise MP4 of a random-weight model's size served by Starlette's FileResponse, as upstream
serves it), in the same run, jobs alternating between the paths:

* node: nodes/session.generate_video with a Remote Server handle (a typed URL) as ComfyUI calls it, the
  VIDEO made through ComfyUI's own comfy_api (--comfy-dir on sys.path; run under ComfyUI's python), the IMAGE
  a torch tensor;
* cli: cli/generate_cmd._generate (the MP4 written, its header checked, no frame decoded);
* client: VideoClient.generate with decode (what the node runs inside, without the node's layers).

Each job's `ours_s` = wall time minus the server's `inference_time_s` (--job-s, from the POST's arrival), split
into: `pre_submit_s` (node: generate_video's start to the POST: build_request, job_client, the clip memory
check), `submit_s` (the POST), `detect_s` (the server's completion to the poll that saw it; the first job of a
kind has no learned end, the later ones poll fast near it), `download_decode_s` (that poll to frames in hand:
the download, the decode running beside it, and what is left of the decode after the last byte), `after_s`
(frames in hand to the node's return: IMAGE, VIDEO, the Done line; for the CLI the file written). The
parts that are not ours (ComfyUI's own work between the node's return and the next node's start) do not
run here; bench/gpu/native.py's node times include them.

Before/after in the same run: `--paths` may add the node path with one thing of the shipped code put back
as it was or changed (VARIANTS; `patched` of decode_levers.py, never a copy of the code), jobs alternating
with the shipped node's, so each variant's medians stand as a ratio against the shipped node's:
  node_delete_after: the client as it was, deleting the job after the decode (it now starts the DELETE once
                     the last byte is in, beside the decode's last frames);
  node_workers4, node_threads12: the decoder's settings (4 conversion threads; 12 decoder threads).

`node_local`, `cli_local`, `client_local`: the same paths given the server's storage folder, as a server the
launcher started here gives it (Supervisor.storage_dir): the stub server stores each finished MP4 there as upstream
does, and the client reads it there instead of downloading it (client/local_result.py); the report's
`local_over_http` gives each one's medians as a ratio of its HTTP path's, from the same run.

    COMFYUI_PYTHON bench/node_overhead.py --comfy-dir COMFYUI_DIR [--serve-python .venv-server/bin/python] \
        [--jobs 4] [--job-s 3] [--paths node,node_local,cli,cli_local,client,client_local] [--out DIR]

Writes DIR/report.json (default bench/out/node-overhead) and prints a summary table. Without ComfyUI (the GPU
box's CPU: `--serve-python python3`, av, starlette, uvicorn and python-multipart installed) the VIDEO is the pack's
stand-in and the Cancel flag reads False, as outside ComfyUI.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shlex
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any, Callable, ContextManager, Iterator, Optional

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from gpu.common import import_package  # noqa: E402

CLIPS = ROOT / "bench" / "out" / "node-overhead"       # the made clips (ignored by git)
SHAPE = (1280, 704, 121)
FPS = 24


def say(*parts: Any) -> None:
    print(*parts, file=sys.stderr, flush=True)


def noise_clip(path: Path, crf: int) -> Path:
    """A random-weight model's kind of clip at SHAPE (decode_bench.make_noise_clip: noise, H.264 yuv420p with
    upstream's preset), made once; `crf` sets its size (16: 53 MB, 14: about 60 MB; the H100's was 67 MB)."""
    if not path.is_file():
        from decode_bench import make_noise_clip

        width, height, frames = SHAPE
        say(f"making the noise clip {width}x{height}x{frames} crf {crf} -> {path}")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(make_noise_clip(frames, width, height, FPS, crf=crf))
    return path


class Served:
    """bench/node_overhead_server.py on a free loopback port (its base URL in `url`)."""

    def __init__(self, python: str, clip: Path, job_s: float) -> None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        # its storage folder (the clip's file system: the stored file is a hard link), 0700 as launch_prep's
        self.storage = str(clip.parent / f"storage-{os.getpid()}")
        os.mkdir(self.storage, 0o700)
        self.proc = subprocess.Popen([python, str(ROOT / "bench" / "node_overhead_server.py"), str(clip),
                                      str(port), str(job_s), self.storage])
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{python} bench/node_overhead_server.py did not start") from None
                time.sleep(0.1)

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)
        shutil.rmtree(self.storage, ignore_errors=True)


class Marks:
    """Timestamps of one job, taken by wrapping the client's endpoints (VideoJobs.submit, .status)."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.submit_in: Optional[float] = None
        self.submit_out: Optional[float] = None
        self.seen_done: Optional[float] = None      # time.time() of the poll that saw completed
        self.done_at: Optional[float] = None        # the server's completed_at_precise
        self.result: Any = None

    def install(self) -> None:
        from vllm_omni_launcher.client import api, video_jobs

        marks = self
        submit, status, generate = video_jobs.VideoJobs.submit, video_jobs.VideoJobs.status, api.VideoClient.generate

        def timed_submit(self: Any, *a: Any, **k: Any) -> str:
            marks.submit_in = time.monotonic()
            try:
                return submit(self, *a, **k)
            finally:
                marks.submit_out = time.monotonic()

        def timed_status(self: Any, *a: Any, **k: Any) -> Any:
            state = status(self, *a, **k)
            if state.status == "completed" and marks.seen_done is None:
                marks.seen_done = time.time()
                marks.done_at = state.raw.get("completed_at_precise")
            return state

        def kept_generate(self: Any, *a: Any, **k: Any) -> Any:
            marks.result = generate(self, *a, **k)
            return marks.result

        video_jobs.VideoJobs.submit = timed_submit
        video_jobs.VideoJobs.status = timed_status
        api.VideoClient.generate = kept_generate


def split(marks: Marks, start: float, end: float, job_s: float) -> dict[str, Optional[float]]:
    """One job's parts (see the module docstring), seconds."""
    t = marks.result.timings if marks.result is not None else {}
    submit_t0 = marks.submit_in               # generate()'s t0 is just before this
    decoded_at = submit_t0 + t["decoded"] if submit_t0 is not None and "decoded" in t else None
    detect = (marks.seen_done - marks.done_at) if marks.seen_done and marks.done_at else None
    return {
        "wall_s": round(end - start, 4),
        "ours_s": round(end - start - job_s, 4),
        "pre_submit_s": round(marks.submit_in - start, 4) if marks.submit_in else None,
        "submit_s": round(marks.submit_out - marks.submit_in, 4) if marks.submit_out and marks.submit_in else None,
        "detect_s": round(detect, 4) if detect is not None else None,
        "download_decode_s": round(t["decoded"] - t["job_done"], 4) if "decoded" in t else None,
        "download_s": round(t["downloaded"] - t["job_done"], 4) if "downloaded" in t else None,
        "read_wait_s": round(t["read_wait"], 4) if "read_wait" in t else None,
        "disk_read_s": round(t["disk_read"], 4) if "disk_read" in t else None,
        "after_s": round(end - decoded_at, 4) if decoded_at is not None else None,
    }


@contextlib.contextmanager
def download_decoding_as(drop: tuple[str, ...] = (), **setting: Any) -> Iterator[None]:
    """The video client's download_decoding with its arguments in `drop` left out (`on_downloaded`: the client
    as it was, deleting the job after the decode) or decode_mp4's `workers` / `threads` set (it passes neither)."""
    from decode_levers import patched
    from vllm_omni_launcher.client import video_jobs

    real = video_jobs.download_decoding

    def changed(*a: Any, **k: Any) -> Any:
        return real(*a, **{**{n: v for n, v in k.items() if n not in drop}, **setting})
    with patched(video_jobs, "download_decoding", changed):
        yield


VARIANTS: dict[str, Callable[[], ContextManager[None]]] = {
    "node_delete_after": lambda: download_decoding_as(drop=("on_downloaded",)),
    "node_workers4": lambda: download_decoding_as(workers=4),
    "node_threads12": lambda: download_decoding_as(threads=12),
}


def node_job(url: str, seed: int, job_s: float, marks: Marks, storage: Optional[str] = None) -> dict:
    """The node with a Remote Server handle; `storage`: its client given that folder, as a Local Server's is."""
    from decode_levers import patched
    from vllm_omni_launcher.client.api import VideoClient
    from vllm_omni_launcher.nodes import session
    from vllm_omni_launcher.nodes.handles import ServerHandle

    width, height, frames = SHAPE
    handle = ServerHandle("remote", url, "Wan-AI/Wan2.2-TI2V-5B-Diffusers", "ti2v_5b")
    def client_for(*args: Any, **kwargs: Any) -> VideoClient:     # job_client passes None for a remote server
        return VideoClient(*args, **{**kwargs, "storage_dir": kwargs.get("storage_dir") or storage})

    marks.reset()
    with patched(session, "VideoClient", client_for):
        start = time.monotonic()
        image, fps, video = session.generate_video(
            handle, node_id=None, prompt="a fox in the snow", negative_prompt="", width=width, height=height,
            frames=frames, fps=FPS, steps=4, guidance=-1.0, seed=seed)
        end = time.monotonic()
    row = split(marks, start, end, job_s)
    row.update(image=list(image.shape), video=type(video).__name__)
    return row


def cli_job(url: str, seed: int, job_s: float, marks: Marks, work: Path, storage: Optional[str] = None) -> dict:
    from vllm_omni_launcher.cli.generate_cmd import _generate
    from vllm_omni_launcher.client.api import VideoClient
    from vllm_omni_launcher.models import ALL_FAMILIES, request_for

    width, height, frames = SHAPE
    request = request_for(ALL_FAMILIES["ti2v_5b"], prompt="a fox in the snow", width=width, height=height,
                          frames=frames, fps=FPS, steps=4, seed=seed)
    args = SimpleNamespace(out=str(work / "clip.mp4"), frames_npy=None, report_json=None)
    marks.reset()
    with VideoClient(url, storage_dir=storage) as client:
        start = time.monotonic()
        _generate(args, client, request, None)
        end = time.monotonic()
    return split(marks, start, end, job_s)


def client_job(url: str, seed: int, job_s: float, marks: Marks, storage: Optional[str] = None) -> dict:
    from vllm_omni_launcher.client.api import VideoClient
    from vllm_omni_launcher.models import ALL_FAMILIES, request_for

    width, height, frames = SHAPE
    request = request_for(ALL_FAMILIES["ti2v_5b"], prompt="a fox in the snow", width=width, height=height,
                          frames=frames, fps=FPS, steps=4, seed=seed)
    marks.reset()
    with VideoClient(url, storage_dir=storage) as client:
        start = time.monotonic()
        client.generate(request)
        end = time.monotonic()
    return split(marks, start, end, job_s)


def micro(clip: bytes, repeat: int) -> dict[str, Optional[float]]:
    """The node's steps after the frames, alone: IMAGE (torch.from_numpy) and VIDEO (comfy_api's VideoFromFile
    over the bytes), medians of `repeat`."""
    from vllm_omni_launcher.nodes import comfy_bridge

    width, height, frames = SHAPE
    array = np.zeros((frames, height, width, 3), np.float32)
    out: dict[str, list[float]] = {"to_image_s": [], "make_video_s": []}
    for _ in range(repeat):
        t = time.perf_counter()
        comfy_bridge.to_image(array)
        out["to_image_s"].append(time.perf_counter() - t)
        t = time.perf_counter()
        comfy_bridge.make_video(clip, FPS)
        out["make_video_s"].append(time.perf_counter() - t)
    return {k: round(statistics.median(v), 5) for k, v in out.items()}


def decode_cpu(clip: bytes, repeat: int) -> dict[str, dict[str, float]]:
    """CPU seconds (user + sys, all threads) and wall of the MP4 -> IMAGE decode from bytes, against what any
    decoder must do, medians of `repeat`: PyAV's decode alone, + the rgb24 conversion (frames._rgb24, inline),
    decode_mp4 into a touched array (the node's case: client/frames.PreparedOutput) and into a fresh one.
    The decode is CPU-bound, so CPU seconds / cores is what a box of more cores can reach."""
    import io
    import resource

    import av

    from vllm_omni_launcher.client.frames import _rgb24, decode_mp4

    width, height, frames = SHAPE

    def pyav(convert: bool) -> None:
        with av.open(io.BytesIO(clip)) as container:
            stream = container.streams.video[0]
            stream.thread_type = "AUTO"
            for frame in container.decode(stream):
                if convert:
                    _rgb24(frame, width, height)
    touched = np.zeros((frames, height, width, 3), np.float32)
    cases: dict[str, Callable[[], Any]] = {
        "pyav_decode_only": lambda: pyav(False), "pyav_decode_rgb24": lambda: pyav(True),
        "decode_mp4_into_touched": lambda: decode_mp4(clip, into=touched), "decode_mp4_fresh": lambda: decode_mp4(clip)}
    out: dict[str, dict[str, float]] = {}
    for name, run in cases.items():
        walls, cpus = [], []
        for _ in range(repeat):
            before, start = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
            run()
            wall, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_SELF)
            walls.append(wall)
            cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
        out[name] = {"wall_s": round(statistics.median(walls), 4), "cpu_s": round(statistics.median(cpus), 4)}
    base = out["pyav_decode_only"]["cpu_s"]
    for row in out.values():
        row["cpu_over_pyav_decode"] = round(row["cpu_s"] / base, 3)
    return out


def medians(rows: list[dict], skip_first: bool) -> dict[str, Optional[float]]:
    """Per-part medians (the first job of a path is left out when `skip_first`: nothing learned yet)."""
    rows = rows[1:] if skip_first and len(rows) > 1 else rows
    keys = [k for k in rows[0] if k.endswith("_s")] if rows else []
    return {k: round(statistics.median([r[k] for r in rows if r.get(k) is not None]), 4)
            if any(r.get(k) is not None for r in rows) else None for k in keys}


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--comfy-dir", default=None, help="a ComfyUI checkout (its comfy_api makes the VIDEO)")
    p.add_argument("--serve-python", default=str(ROOT / ".venv-server" / "bin" / "python"),
                   help="a python with starlette and uvicorn (the server venv's)")
    p.add_argument("--clip", default=None, help="the MP4 to serve (default: made once under bench/out/, see --crf)")
    p.add_argument("--crf", type=int, default=14, help="the made clip's x264 crf (its size)")
    p.add_argument("--jobs", type=int, default=4, help="jobs per path (the first of each is the first of its kind)")
    p.add_argument("--job-s", type=float, default=3.0, help="each job's time on the server")
    p.add_argument("--paths", default="node,node_local,cli,cli_local,client,client_local",
                   help=f"node, cli, client, each with _local (read from the server's folder), and the node "
                        f"variants: {', '.join(VARIANTS)}")
    p.add_argument("--out", default=str(ROOT / "bench" / "out" / "node-overhead"))
    a = p.parse_args(argv)
    if a.comfy_dir:
        sys.path.insert(0, str(Path(a.comfy_dir).resolve()))
        import comfy.cli_args  # the Cancel flag's module picks its device on import: this box's CPU

        comfy.cli_args.args.cpu = True
        # No PromptServer runs here (its module would fail to import on every bar move, 10 ms each): a stand-in
        # without an instance, so the bar and the status line are skipped as outside ComfyUI. In ComfyUI each
        # bar move is one round trip through its server loop.
        sys.modules["server"] = ModuleType("server")
        sys.modules["server"].PromptServer = SimpleNamespace(instance=None)  # type: ignore[attr-defined]
    import_package()
    from vllm_omni_launcher.nodes import comfy_bridge

    comfy_bridge.interrupted()          # what a running ComfyUI has loaded already (its Cancel flag, torch), so the
    comfy_bridge.to_image(np.zeros((1, 1, 1, 3), np.float32))   # first job's split is that of a first job only
    config = Path(tempfile.mkdtemp(prefix="vllm-omni-bench-config-")) / "config.json"
    config.write_text("{}")
    os.environ["VLLM_OMNI_LAUNCHER_CONFIG"] = str(config)
    clip = noise_clip(Path(a.clip) if a.clip else CLIPS / f"noise-1280x704x121-crf{a.crf}.mp4", a.crf)
    data = clip.read_bytes()
    marks = Marks()
    marks.install()
    served = Served(a.serve_python, clip, a.job_s)
    rows: dict[str, list[dict]] = {path: [] for path in a.paths.split(",")}
    work = Path(tempfile.mkdtemp(prefix="vllm-omni-bench-cli-"))
    def variant(name: str) -> Callable[[int], dict]:
        def run(seed: int) -> dict:
            with VARIANTS[name]():
                return node_job(served.url, seed, a.job_s, marks)
        return run

    runs: dict[str, Callable[[int], dict]] = {
        **{name: variant(name) for name in VARIANTS},
        "node": lambda seed: node_job(served.url, seed, a.job_s, marks),
        "cli": lambda seed: cli_job(served.url, seed, a.job_s, marks, work),
        "client": lambda seed: client_job(served.url, seed, a.job_s, marks),
        "node_local": lambda seed: node_job(served.url, seed, a.job_s, marks, served.storage),
        "cli_local": lambda seed: cli_job(served.url, seed, a.job_s, marks, work, served.storage),
        "client_local": lambda seed: client_job(served.url, seed, a.job_s, marks, served.storage)}
    try:
        for i in range(a.jobs):
            for path in rows:
                row = runs[path](100 + i)
                rows[path].append(row)
                say(f"{path} job {i}: " + " ".join(f"{k}={v}" for k, v in row.items() if k.endswith("_s")))
    finally:
        served.close()
    report = {
        "command": " ".join(shlex.quote(x) for x in [Path(sys.executable).name, *sys.argv]),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "shape": list(SHAPE), "mp4_bytes": len(data), "job_s": a.job_s,
        "rows": rows,
        "warm_medians": {path: medians(r, True) for path, r in rows.items()},
        "first_job": {path: r[0] for path, r in rows.items() if r},
        "node_steps_alone": micro(data, 5),
        "decode_cpu": decode_cpu(data, 3),
    }
    node = report["warm_medians"].get("node", {})
    report["over_shipped_node"] = {
        path: {k: round(v / node[k], 3) for k, v in med.items() if k in ("ours_s", "after_s", "download_decode_s")
               and v is not None and node.get(k)}
        for path, med in report["warm_medians"].items() if path != "node"}
    report["local_over_http"] = {
        path: {k: round(v / http[k], 3) for k, v in med.items() if v is not None and http.get(k)}
        for path, med in report["warm_medians"].items() if path.endswith("_local")
        for http in [report["warm_medians"].get(path[:-len("_local")], {})]}
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report, indent=1))
    for path, med in report["warm_medians"].items():
        print(f"{path:7s} " + " ".join(f"{k}={v}" for k, v in med.items()))
    print("alone:", report["node_steps_alone"])
    print("decode from bytes:", json.dumps(report["decode_cpu"]))
    print("over the shipped node:", json.dumps(report["over_shipped_node"]))
    print("local over http:", json.dumps(report["local_over_http"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
