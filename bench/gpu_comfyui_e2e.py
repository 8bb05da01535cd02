"""The whole user path (issue 15): a real ComfyUI with this pack queues our templates' API twins,
the launcher starts the vLLM-Omni server, and we watch what a user would see.

Runs on the GPU machine under ComfyUI's own python (bench/gpu_session.sh sets it up), and on a
CPU box with ``--cpu`` against the stub server (the rehearsal). Drives ComfyUI only over its
HTTP API (``/prompt``, ``/history``, ``/view``, ``/interrupt``) and its websocket (``/ws``:
``progress``, ``executing``, ``execution_cached``, ``execution_interrupted`` and the binary
text events our nodes send). Checks (issue 15's numbering):

1. ``t2v``: the TI2V text-to-video template, model ``local/<folder>``, serving ``auto``: the
   plan text, per-step progress, IMAGE [F,H,W,3] (Get Image Size -> Preview Any, and frame 0
   into a Save Image node), the VIDEO file (decoded with PyAV: frames, size, fps).
2. ``cached`` / ``reseed``: the same graph again runs nothing and sends no job; a new seed
   re-runs only Generate Video (+ its outputs) on the same server pid.
3. ``i2v``: the image-to-video template with ComfyUI's example.png.
4. ``cancel``: ``/interrupt`` mid-denoise of a long job; seconds until ComfyUI reports the
   prompt interrupted, what the node said, and (GPU) when NVML shows the GPU idle.
5. ``kill``: SIGKILL of ComfyUI (its main process only) while the server is up; seconds until
   no server process is left (GPU: ``nvidia-smi --query-compute-apps``; CPU: /proc).
6. per job: ComfyUI-side wall time of Generate Video against the server's own times from its
   log (stats table ``stage_gen_time_ms`` + MP4 encoding), and the planner's predicted GiB
   (Local Server's text) against the NVML peak sampled during the job.

The report (``--out``/report.json) is rewritten after every check, so a call that runs out of
time still returns what was measured; ``--deadline-s`` skips checks that would not fit.
"""
from __future__ import annotations

import argparse
import asyncio
import copy
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Optional

REPO = Path(__file__).resolve().parents[1]
PKG = Path(os.environ.get("VLLM_OMNI_LAUNCHER_PKG") or REPO).resolve()   # the pack ComfyUI loads (gpu_e2e.PKG)
sys.path.insert(0, str(PKG / "tests" / "comfyui"))

sys.path.insert(0, str(REPO / "bench"))

from comfy_harness import PACK_NAME, ComfyUI, comfyui_version  # noqa: E402
from gpu.common import NOT_ON_CPU, Gpu, import_package as _import_package  # noqa: E402,F401  (Gpu: the scripts' name)

T2V = "wan22_ti2v_5b_text_to_video"
I2V = "wan22_ti2v_5b_image_to_video"
TEXT_EVENT = 3                                   # ComfyUI's BinaryEventTypes.TEXT (send_progress_text)
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
JOB_LINE = re.compile(r'"POST /v1/videos HTTP/1\.[01]" \d{3}')
STAGE_MS = re.compile(r"\|\s*stage_gen_time_ms\s*\|\s*([\d.]+)\s*\|")
ENCODE_MS = re.compile(r"Video response encoding \(MP4 bytes\): ([\d.]+) ms")
STEP = re.compile(r"(\d+)/(\d+)")


# ----------------------------------------------------------------------------- pure parts
def load_api(name: str) -> dict:
    return json.loads((PKG / "workflows" / "api" / f"{name}.api.json").read_text())


def node_of(prompt: dict, class_type: str) -> str:
    return next(k for k, e in prompt.items() if e["class_type"] == class_type)


def build_prompt(template: dict, model: str, generate: dict, serving: Optional[dict] = None,
                 probes: bool = True) -> dict:
    """The template's API twin pointed at ``model``, with Generate Video / Serving Config
    inputs overridden, plus probe nodes that make the IMAGE and fps visible in /history:
    Get Image Size -> Preview Any (width, height, batch), Preview Any (fps), and frame 0 of the
    IMAGE through Image From Batch into Save Image (a real save node, channels checkable)."""
    prompt = copy.deepcopy(template)
    prompt[node_of(prompt, "VLLMOmniLoadModel")]["inputs"]["model"] = model
    prompt[node_of(prompt, "VLLMOmniServingConfig")]["inputs"].update(serving or {})
    gen = node_of(prompt, "VLLMOmniGenerateVideo")
    prompt[gen]["inputs"].update(generate)
    if probes:
        prompt["90"] = {"class_type": "GetImageSize", "inputs": {"image": [gen, 0]}}
        for slot, name in enumerate(("width", "height", "batch")):
            prompt[f"9{slot + 1}"] = {"class_type": "PreviewAny", "inputs": {"source": ["90", slot]},
                                      "_meta": {"title": name}}
        prompt["94"] = {"class_type": "PreviewAny", "inputs": {"source": [gen, 1]}, "_meta": {"title": "fps"}}
        prompt["95"] = {"class_type": "ImageFromBatch", "inputs": {"image": [gen, 0], "batch_index": 0, "length": 1}}
        prompt["96"] = {"class_type": "SaveImage", "inputs": {"images": ["95", 0], "filename_prefix": "e2e/frame0"}}
    return prompt


def probe_values(outputs: dict) -> dict[str, Optional[float]]:
    """width / height / batch / fps from the Preview Any nodes' ui text in a /history entry."""
    values: dict[str, Optional[float]] = {}
    for node, name in (("91", "width"), ("92", "height"), ("93", "batch"), ("94", "fps")):
        text = (outputs.get(node) or {}).get("text") or [None]
        try:
            values[name] = float(text[0])
        except (TypeError, ValueError):
            values[name] = None
    return values


def count_jobs(log_text: str) -> int:
    """Video jobs a server log says it received (uvicorn's POST /v1/videos access lines)."""
    return len(JOB_LINE.findall(_ANSI.sub("", log_text)))


def server_times(log_text: str) -> list[dict[str, float]]:
    """Per job, the server's own seconds from its log: stage generation time (the stats table)
    and the MP4 encoding line; the two come one after the other per job."""
    text = _ANSI.sub("", log_text)
    stages = [float(x) / 1000 for x in STAGE_MS.findall(text)]
    encodes = [float(x) / 1000 for x in ENCODE_MS.findall(text)]
    out = []
    for i, stage in enumerate(stages):
        encode = encodes[i] if i < len(encodes) else 0.0
        out.append({"stage_gen_s": round(stage, 6), "mp4_encode_s": round(encode, 6),
                    "server_s": round(stage + encode, 4)})
    return out


def summarize_progress(events: list[dict], node: str) -> dict[str, Any]:
    """What the websocket showed for one node: progress events and its text messages."""
    prog = [e for e in events if e["type"] == "progress" and str(e["data"].get("node")) == node]
    texts = [e["text"] for e in events if e["type"] == "text" and e["node"] == node]
    steps = sorted({int(m.group(1)) for t in texts for m in [STEP.search(t)] if m and "Step" in t})
    return {"progress_events": len(prog),
            "progress_last": None if not prog else [prog[-1]["data"].get("value"), prog[-1]["data"].get("max")],
            "texts": len(texts), "first_text": texts[0] if texts else None, "last_text": texts[-1] if texts else None,
            "denoise_steps_seen": steps}


def executed_nodes(events: list[dict], prompt_id: str) -> tuple[list[str], list[str]]:
    """(nodes that ran, nodes served from cache) for one prompt, from the websocket."""
    ran = [str(e["data"]["node"]) for e in events if e["type"] == "executing"
           and e["data"].get("prompt_id") == prompt_id and e["data"].get("node") is not None]
    cached = [str(n) for e in events if e["type"] == "execution_cached"
              and e["data"].get("prompt_id") == prompt_id for n in e["data"].get("nodes", [])]
    return sorted(set(ran)), sorted(set(cached))


def verdict(report: dict) -> dict:
    """all_ok and the list of failed checks from every check's ``ok``."""
    checks = report.get("checks", {})
    failed = sorted(k for k, c in checks.items() if c.get("ok") is False)
    report["failed"] = failed
    report["all_ok"] = bool(checks) and not failed and all(c.get("ok") is True for c in checks.values())
    return report


# ----------------------------------------------------------------------------- watchers
class Websocket:
    """ComfyUI's /ws for one client id, read in a thread; every event with its arrival time."""

    def __init__(self, url: str, client_id: str) -> None:
        self.url = url.replace("http://", "ws://") + f"/ws?clientId={client_id}"
        self.events: list[dict] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError(f"websocket {self.url} did not connect")

    async def _run(self) -> None:
        import aiohttp

        async with aiohttp.ClientSession() as session:
            async with session.ws_connect(self.url, heartbeat=20) as ws:
                self._ready.set()
                while not self._stop.is_set():
                    try:
                        msg = await ws.receive(timeout=0.5)
                    except asyncio.TimeoutError:
                        continue
                    if msg.type == aiohttp.WSMsgType.TEXT:
                        data = json.loads(msg.data)
                        self._add({"type": data.get("type"), "data": data.get("data") or {}})
                    elif msg.type == aiohttp.WSMsgType.BINARY:
                        self._add(_binary_event(msg.data))
                    elif msg.type in (aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.ERROR):
                        return

    def _add(self, event: dict) -> None:
        event["t"] = time.monotonic()
        with self._lock:
            self.events.append(event)

    def snapshot(self) -> list[dict]:
        with self._lock:
            return list(self.events)

    def wait_for(self, pred: Callable[[dict], bool], timeout: float, start: int = 0) -> Optional[dict]:
        """The first event from index ``start`` on that ``pred`` accepts (None after ``timeout``)."""
        deadline = time.monotonic() + timeout
        seen = start
        while time.monotonic() < deadline:
            events = self.snapshot()
            for e in events[seen:]:
                if pred(e):
                    return e
            seen = len(events)
            time.sleep(0.02)
        return None

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)


def _binary_event(raw: bytes) -> dict:
    kind = struct.unpack(">I", raw[:4])[0]
    if kind != TEXT_EVENT:
        return {"type": f"binary{kind}", "data": {}}
    n = struct.unpack(">I", raw[4:8])[0]
    return {"type": "text", "data": {}, "node": raw[8:8 + n].decode(), "text": raw[8 + n:].decode(errors="replace")}


# ----------------------------------------------------------------------------- ComfyUI
class Comfy(ComfyUI):
    """A ComfyUI process as a user runs it: ``main.py --listen 127.0.0.1`` (``--cpu`` only in the
    rehearsal), the pack under ``<base>/custom_nodes``, no front end (an empty ``--front-end-root``)."""

    def __init__(self, comfy_dir: Path, python: str, env: dict[str, str], base: Path, cpu: bool,
                 extra_args: tuple[str, ...] = ()) -> None:
        from comfy_harness import free_port

        self.comfy_dir = Path(comfy_dir).resolve()
        self.python = python
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.base = base
        for sub in ("custom_nodes", "input", "output", "user", "models/diffusers", "empty-front-end"):
            (base / sub).mkdir(parents=True, exist_ok=True)
        link = base / "custom_nodes" / PACK_NAME
        if link.is_symlink() and link.resolve() != PKG:   # a link left by an earlier call's copy
            link.unlink()
        if not link.is_symlink():
            link.symlink_to(PKG, target_is_directory=True)
        example = self.comfy_dir / "input" / "example.png"
        if example.is_file():
            shutil.copy2(example, base / "input" / "example.png")
        self.log_path = base / "comfyui.log"
        child_env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        child_env.update(env)
        child_env["PYTHONUNBUFFERED"] = "1"
        self.argv = [python, str(self.comfy_dir / "main.py"), *(["--cpu"] if cpu else []),
                     "--listen", "127.0.0.1", "--port", str(self.port), "--base-directory", str(base),
                     "--disable-all-custom-nodes", "--whitelist-custom-nodes", PACK_NAME,
                     "--disable-auto-launch", "--database-url", "sqlite:///:memory:",
                     "--front-end-root", str(base / "empty-front-end"), *extra_args]
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(self.argv, cwd=str(self.comfy_dir), stdin=subprocess.DEVNULL,
                                     stdout=self._log, stderr=subprocess.STDOUT, env=child_env,
                                     start_new_session=True)


# ----------------------------------------------------------------------------- the run
class Run:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.t_start = time.monotonic()
        self.out = Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.base = Path(args.base)
        self.data_dir = self.base / "launcher-data"
        self.model = f"local/{args.model_folder}"
        self.gpu = Gpu(not args.cpu)
        self.report: dict[str, Any] = {
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "command": " ".join(sys.argv), "mode": "cpu rehearsal (stub server)" if args.cpu else "gpu",
            "comfyui_version": comfyui_version(Path(args.comfy_dir)), "model": self.model,
            "request": self.request(), "serving": self.serving(), "checks": {}}
        self.comfy: Optional[Comfy] = None
        self.ws: Optional[Websocket] = None
        self.client_id = str(uuid.uuid4())

    # -- settings -------------------------------------------------------------------------
    def request(self) -> dict:
        a = self.args
        return {"width": a.width, "height": a.height, "frames": a.frames, "steps": a.steps, "fps": 0}

    def serving(self) -> dict:
        return {"compile": False} if self.args.eager else {}

    def env(self) -> dict[str, str]:
        env = {"VLLM_OMNI_LAUNCHER_DATA_DIR": str(self.data_dir)}
        if self.args.launcher_env:
            env.update(json.loads(Path(self.args.launcher_env).read_text()))
        return env

    def remaining(self) -> float:
        return self.args.deadline_s - (time.monotonic() - self.t_start)

    # -- plumbing -------------------------------------------------------------------------
    def start_comfy(self) -> None:
        t0 = time.monotonic()
        self.comfy = Comfy(Path(self.args.comfy_dir), self.args.python, self.env(), self.base, self.args.cpu,
                           tuple(self.args.comfy_arg))
        self.comfy.wait_ready(timeout=240)
        self.report["comfyui_ready_s"] = round(time.monotonic() - t0, 2)
        # ComfyUI itself holds a CUDA context on the GPU: NVML peaks below include it
        self.report["nvml_mib_comfyui_ready"] = self.gpu.peak_mib(time.monotonic() - 1.0)
        self.report["gpu_processes_comfyui_ready"] = self.gpu.processes()
        info = self.comfy.get("/object_info/VLLMOmniGenerateVideo")
        assert "VLLMOmniGenerateVideo" in info, "our nodes are not registered"
        self.ws = Websocket(self.comfy.url, self.client_id)

    def server_logs(self) -> list[Path]:
        d = self.data_dir / "logs"
        return sorted(d.glob("*.log"), key=lambda p: p.stat().st_mtime) if d.is_dir() else []

    def server_log_text(self) -> str:
        return "".join(p.read_text(errors="replace") for p in self.server_logs())

    def server_pids(self) -> list[int]:
        pids = []
        for p in sorted((self.data_dir / "state").glob("server-*.json")):
            try:
                pid = json.loads(p.read_text()).get("server_pid")
            except (OSError, ValueError):
                continue
            if pid:
                pids.append(int(pid))
        return pids

    def queue(self, prompt: dict) -> str:
        assert self.comfy is not None
        status, body = self.comfy.post("/prompt", {"prompt": prompt, "client_id": self.client_id})
        assert status == 200 and not body.get("node_errors"), f"/prompt refused it: {status} {body}"
        return body["prompt_id"]

    def run_job(self, name: str, prompt: dict, timeout: float) -> dict:
        """Queue, wait for /history, and collect everything one job shows."""
        assert self.comfy is not None and self.ws is not None
        gen = node_of(prompt, "VLLMOmniGenerateVideo")
        local = node_of(prompt, "VLLMOmniLocalServer")
        jobs_before, server_jobs_before = count_jobs(self.server_log_text()), len(server_times(self.server_log_text()))
        first_event = len(self.ws.snapshot())
        t0 = time.monotonic()
        pid = self.queue(prompt)
        entry = self.comfy.wait_history(pid, timeout=timeout, poll=0.25)
        t_end = time.monotonic()
        events = self.ws.snapshot()[first_event:]
        ran, cached = executed_nodes(events, pid)
        gen_start = next((e["t"] for e in events if e["type"] == "executing"
                          and str(e["data"].get("node")) == gen), None)
        gen_end = next((e["t"] for e in events if e["type"] == "executing" and e["t"] > (gen_start or 1e18)
                        and str(e["data"].get("node")) != gen), t_end)
        log_text = self.server_log_text()
        times = server_times(log_text)[server_jobs_before:]
        outputs = entry.get("outputs", {})
        job: dict[str, Any] = {
            "prompt_id": pid, "status": entry.get("status", {}).get("status_str"), "wall_s": round(t_end - t0, 3),
            "ran": ran, "cached": cached, "new_server_jobs": count_jobs(log_text) - jobs_before,
            "server_pids": self.server_pids(), "server_logs": len(self.server_logs()),
            "server_alloc_conf": [server_env_var(p, "PYTORCH_CUDA_ALLOC_CONF") for p in self.server_pids()],
            "generate": summarize_progress(events, gen), "local_server": summarize_progress(events, local),
            "probes": probe_values(outputs)}
        if entry.get("status", {}).get("status_str") == "error":
            job["error"] = [m for m in entry["status"].get("messages", []) if m[0] == "execution_error"]
        local_texts = [e["text"] for e in events if e["type"] == "text" and e["node"] == local]
        job["planner"] = self.prediction(prompt[gen]["inputs"])
        job["local_server_texts"] = local_texts[-3:]
        peak = self.gpu.peak_mib(t0, t_end)
        job["nvml_peak_mib"] = peak
        job["nvml_peak_gib"] = round(peak / 1024, 2) if isinstance(peak, int) else peak
        if gen_start is not None and gen in ran:
            job["generate_node_wall_s"] = round(gen_end - gen_start, 3)
            if times:
                job["server_times"] = times[-1]
                job["overhead_s"] = round(job["generate_node_wall_s"] - times[-1]["server_s"], 3)
        job.update(self.files(outputs))
        self.report.setdefault("jobs", {})[name] = job
        return job

    def prediction(self, inputs: dict) -> dict:
        """What the planner recommends for this request on this machine (serving `auto` asks the
        same function): its configuration and predicted per-GPU peak, to set against NVML's."""
        try:
            _import_package()
            from vllm_omni_launcher.planner.ladder import recommend
            from vllm_omni_launcher.planner.memory import RequestShape

            model_dir = str(self.base / "models" / "diffusers" / self.args.model_folder)
            rec = recommend(model_dir, RequestShape(inputs["width"], inputs["height"], inputs["frames"]),
                            gpus=[self.args.cpu_gpu_gib] if self.args.cpu else None)
            return {"label": rec.label, "flags": None if rec.spec is None else rec.spec.flags(),
                    "peak_gib": None if rec.plan is None else round(rec.plan.peak_gib, 2),
                    "gpus": [] if rec.plan is None else [g.to_dict() for g in rec.plan.gpus]}
        except Exception as exc:   # the prediction is a measurement aid; its failure is reported
            return {"error": f"{type(exc).__name__}: {exc}"[:1000]}

    def files(self, outputs: dict) -> dict:
        """The SaveImage frame (size, mode) and the SaveVideo file (frames, size, fps by PyAV)."""
        assert self.comfy is not None
        found: dict[str, Any] = {}
        for out in outputs.values():
            for kind in ("images", "videos", "animated"):
                for item in out.get(kind, []) if isinstance(out.get(kind), list) else []:
                    if not isinstance(item, dict) or "filename" not in item:
                        continue
                    path = self.base / item.get("type", "output") / item.get("subfolder", "") / item["filename"]
                    if path.suffix.lower() == ".png":
                        from PIL import Image

                        with Image.open(path) as im:
                            found["frame0_png"] = {"size": list(im.size), "mode": im.mode}
                    else:
                        found["video_file"] = describe_video(path)
        return found

    def save(self) -> None:
        verdict(self.report)
        self.report["elapsed_s"] = round(time.monotonic() - self.t_start, 1)
        (self.out / "report.json").write_text(json.dumps(self.report, indent=1, default=str))

    def collect_logs(self) -> None:
        logs = self.out / "logs"
        logs.mkdir(exist_ok=True)
        if self.comfy is not None and self.comfy.log_path.is_file():
            shutil.copy2(self.comfy.log_path, logs / "comfyui.log")
        for p in self.server_logs():
            shutil.copy2(p, logs / p.name)

    def check(self, name: str, need_s: float, fn: Callable[[], dict]) -> None:
        if name not in self.args.checks:
            return
        if self.remaining() < need_s:
            self.report["checks"][name] = {"ok": None, "skipped": f"{self.remaining():.0f}s left, needs ~{need_s:.0f}s"}
            self.save()
            return
        print(f"== {name} ({self.remaining():.0f}s left)", flush=True)
        try:
            result = fn()
        except Exception as exc:   # the report says what failed; the next check still runs
            result = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:4000]}
        self.report["checks"][name] = result
        print(json.dumps(result, default=str)[:3000], flush=True)
        self.save()

    # -- the checks ------------------------------------------------------------------------
    def t2v_prompt(self, seed: int, **generate: Any) -> dict:
        return build_prompt(load_api(T2V), self.model, {**self.request(), "seed": seed, **generate}, self.serving())

    def expect_shape(self, job: dict, frames: int) -> dict[str, bool]:
        a = self.args
        p, video = job["probes"], job.get("video_file") or {}
        return {
            "completed": job["status"] == "success",
            "image_shape": [p["batch"], p["height"], p["width"]] == [frames, a.height, a.width]
            and job.get("frame0_png", {}).get("mode") == "RGB"
            and job.get("frame0_png", {}).get("size") == [a.width, a.height],
            "video_file": video.get("frames") == frames and video.get("size") == [a.width, a.height],
            "fps": p["fps"] == a.expect_fps and abs((video.get("fps") or 0) - a.expect_fps) < 0.01,
            "progress_steps": bool(job["generate"]["denoise_steps_seen"])
            and job["generate"]["progress_last"] == [a.steps, a.steps],
        }

    def c_t2v(self) -> dict:
        job = self.run_job("t2v", self.t2v_prompt(1001), timeout=self.remaining())
        ok = self.expect_shape(job, self.args.frames)
        return {"ok": all(ok.values()), "checks": ok, "job": "t2v",
                "plan": job["local_server"]["last_text"], "ready_text": job["local_server_texts"]}

    def c_cached(self) -> dict:
        again = self.run_job("t2v_again", self.t2v_prompt(1001), timeout=120)
        reseed = self.run_job("t2v_reseed", self.t2v_prompt(1002), timeout=self.remaining())
        first = self.report["jobs"]["t2v"]
        ok = {
            "again_no_job": again["new_server_jobs"] == 0 and again["status"] == "success",
            "again_ran_nothing": again["ran"] == [],
            "reseed_one_job": reseed["new_server_jobs"] == 1 and reseed["status"] == "success",
            "reseed_same_server": reseed["server_pids"] == first["server_pids"] != []
            and reseed["server_logs"] == first["server_logs"],
            "reseed_reran_only_generate": "4" not in reseed["ran"] and "5" in reseed["ran"]
            and {"2", "3", "4"} <= set(reseed["cached"]),
        }
        return {"ok": all(ok.values()), "checks": ok, "jobs": ["t2v_again", "t2v_reseed"]}

    def c_i2v(self) -> dict:
        prompt = build_prompt(load_api(I2V), self.model, {**self.request(), "seed": 2001}, self.serving())
        job = self.run_job("i2v", prompt, timeout=self.remaining())
        ok = self.expect_shape(job, self.args.frames)
        ok["same_server"] = job["server_pids"] == self.report.get("jobs", {}).get("t2v", {}).get("server_pids")
        return {"ok": all(ok.values()), "checks": ok, "job": "i2v"}

    def c_cancel(self) -> dict:
        """Interrupt a long job once its denoise reached --cancel-at-step; time the node's end."""
        assert self.comfy is not None and self.ws is not None
        a = self.args
        prompt = self.t2v_prompt(3001, steps=a.cancel_steps)
        gen = node_of(prompt, "VLLMOmniGenerateVideo")
        start = len(self.ws.snapshot())
        pid = self.queue(prompt)

        def at_step(e: dict) -> bool:
            if e["type"] != "text" or e["node"] != gen or "Step" not in e["text"]:
                return False
            m = STEP.search(e["text"])
            return bool(m) and int(m.group(1)) >= a.cancel_at_step

        hit = self.ws.wait_for(at_step, timeout=max(10.0, self.remaining() - 120), start=start)
        if hit is None:
            return {"ok": False, "error": f"Generate never reached step {a.cancel_at_step}",
                    "texts": summarize_progress(self.ws.snapshot()[start:], gen)}
        pids_before = self.server_pids()
        t_int = time.monotonic()
        self.comfy.interrupt()
        ended = self.ws.wait_for(lambda e: e["type"] in ("execution_interrupted", "execution_error",
                                                         "execution_success")
                                 and e["data"].get("prompt_id") == pid, timeout=30, start=start)
        node_end_s = None if ended is None else round(ended["t"] - t_int, 3)
        gpu_idle_s = self.gpu.idle_after(t_int, timeout=min(150.0, max(10.0, self.remaining() - 60)))
        time.sleep(1.0)
        events = self.ws.snapshot()[start:]
        after = [e["text"] for e in events if e["type"] == "text" and e["node"] == gen and e["t"] >= t_int]
        status = self.status_text()
        result = {
            "interrupted_at": hit["text"], "node_end_after_interrupt_s": node_end_s,
            "ended_as": None if ended is None else ended["type"], "generate_texts_after_interrupt": after,
            "gpu_idle_after_interrupt_s": gpu_idle_s, "server_pids_before": pids_before,
            "server_pids_after": self.server_pids(), "server_status_text": status,
            "log_tail": [ln for ln in _ANSI.sub("", self.server_log_text()).splitlines()
                         if "vllm-omni-launcher" in ln or "cancel" in ln.lower()][-10:]}
        result["ok"] = (node_end_s is not None and node_end_s < a.cancel_bound_s
                        and result["ended_as"] == "execution_interrupted")
        return result

    def status_text(self) -> Optional[str]:
        """Queue a Server Status node alone; the report text it shows."""
        assert self.ws is not None and self.comfy is not None
        start = len(self.ws.snapshot())
        pid = self.queue({"1": {"class_type": "VLLMOmniServerStatus", "inputs": {}}})
        self.comfy.wait_history(pid, timeout=60, poll=0.25)
        texts = [e["text"] for e in self.ws.snapshot()[start:] if e["type"] == "text" and e["node"] == "1"]
        return texts[-1] if texts else None

    def c_kill(self) -> dict:
        """SIGKILL ComfyUI's main process with the server up; seconds until no server process is left."""
        assert self.comfy is not None
        a = self.args
        tiny = self.run_job("kill_warmup", self.t2v_prompt(4001, steps=2), timeout=max(60.0, self.remaining() - 40))
        pids = self.server_pids()
        gpu_before = self.gpu.processes()
        if not pids:
            return {"ok": False, "error": "no server was running before the kill", "warmup": tiny["status"]}
        t_kill = time.monotonic()
        os.kill(self.comfy.proc.pid, signal.SIGKILL)
        self.comfy.proc.wait(10)
        gone_s = gpu_gone_s = None
        while time.monotonic() - t_kill < a.kill_bound_s * 4:
            alive = [p for p in pids if Path(f"/proc/{p}").exists() and _state(p) != "Z"]
            if not alive and gone_s is None:
                gone_s = round(time.monotonic() - t_kill, 2)
            procs = self.gpu.processes()
            if procs == [] and gpu_gone_s is None:
                gpu_gone_s = round(time.monotonic() - t_kill, 2)
            if gone_s is not None and (gpu_gone_s is not None or not self.gpu.enabled):
                break
            time.sleep(0.2)
        result = {"server_pids": pids, "gpu_processes_before": gpu_before, "server_gone_after_s": gone_s,
                  "gpu_processes_gone_after_s": gpu_gone_s if self.gpu.enabled else NOT_ON_CPU,
                  "gpu_processes_after": self.gpu.processes()}
        bound_ok = lambda s: s is not None and s < a.kill_bound_s  # noqa: E731
        result["ok"] = bound_ok(gone_s) and (bound_ok(gpu_gone_s) if self.gpu.enabled else True)
        return result

    def run(self) -> int:
        try:
            self.start_comfy()
            self.check("t2v", 60, self.c_t2v)
            self.check("cached", 40, self.c_cached)
            self.check("i2v", 40, self.c_i2v)
            self.check("cancel", 60, self.c_cancel)
            self.check("kill", 30, self.c_kill)
        except Exception as exc:
            self.report["error"] = f"{type(exc).__name__}: {exc}"[:6000]
        finally:
            if self.ws is not None:
                self.ws.close()
            if self.comfy is not None:
                self.comfy.stop()     # SIGTERM: the launcher stops its servers on exit
            self.gpu.close()
            self.report["gpu_processes_at_end"] = self.gpu.processes()
            self.collect_logs()
            self.save()
        print(f"all_ok={self.report['all_ok']} failed={self.report['failed']} -> {self.out / 'report.json'}")
        return 0 if self.report["all_ok"] else 1


def server_env_var(pid: int, name: str) -> Optional[str]:
    """One variable of a server process's environment (ComfyUI's cuda_malloc sets
    PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync in its own process, and the launcher passes
    PYTORCH_* on). Only that name is read: the environment also holds the server's API key."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    prefix = name.encode() + b"="
    return next((v[len(prefix):].decode(errors="replace") for v in raw.split(b"\0") if v.startswith(prefix)), None)


def _state(pid: int) -> Optional[str]:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def describe_video(path: Path) -> dict:
    """Frames, size, fps and bytes of a video file, decoded by PyAV (what ComfyUI's VIDEO holds)."""
    import av

    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        frames = sum(1 for _ in container.decode(stream))
        return {"file": path.name, "bytes": path.stat().st_size, "frames": frames,
                "size": [stream.codec_context.width, stream.codec_context.height],
                "fps": float(stream.average_rate or 0), "codec": stream.codec_context.name}


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--comfy-dir", required=True, help="ComfyUI source (main.py)")
    p.add_argument("--python", default=sys.executable, help="ComfyUI's python")
    p.add_argument("--base", required=True, help="ComfyUI --base-directory (models/diffusers/<folder> inside)")
    p.add_argument("--model-folder", required=True, help="folder under <base>/models/diffusers")
    p.add_argument("--out", required=True)
    p.add_argument("--launcher-env", help="JSON file: environment for ComfyUI (the launcher's local settings)")
    p.add_argument("--cpu", action="store_true", help="rehearsal: ComfyUI --cpu, no NVML")
    p.add_argument("--comfy-arg", action="append", default=[],
                   help="one more ComfyUI argument (e.g. --comfy-arg=--disable-cuda-malloc)")
    p.add_argument("--cpu-gpu-gib", type=float, default=141.0,
                   help="--cpu: the GPU size the planner prediction assumes (as VLLM_OMNI_LAUNCHER_GPU_MEMORY_GB)")
    p.add_argument("--eager", action="store_true", help="Serving Config compile=false (the template says true)")
    p.add_argument("--width", type=int, default=1280)
    p.add_argument("--height", type=int, default=704)
    p.add_argument("--frames", type=int, default=121)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--expect-fps", type=float, default=24.0)
    p.add_argument("--cancel-steps", type=int, default=40)
    p.add_argument("--cancel-at-step", type=int, default=3)
    p.add_argument("--cancel-bound-s", type=float, default=1.5, help="issue: node ends within 1 s")
    p.add_argument("--kill-bound-s", type=float, default=10.0, help="issue: a few seconds")
    p.add_argument("--checks", default="t2v,cached,i2v,cancel,kill")
    p.add_argument("--deadline-s", type=float, default=540.0, help="skip checks that would end after this")
    args = p.parse_args(argv)
    args.checks = set(args.checks.split(","))
    return args


if __name__ == "__main__":
    raise SystemExit(Run(parse_args()).run())
