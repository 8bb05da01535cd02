"""The whole user path (issue 15): a real ComfyUI with this pack queues our templates' API twins,
the launcher starts the vLLM-Omni server, and we watch what a user would see.

Runs on the GPU machine under ComfyUI's own python (bench/gpu_session.sh sets it up), and on a
CPU box with ``--cpu`` against the stub server (the rehearsal). Drives ComfyUI only over its
HTTP API (``/prompt``, ``/history``, ``/view``, ``/interrupt``) and its websocket (``/ws``: the
node's bar as ``progress_state`` / ``progress``, ``executing``, ``execution_cached``,
``execution_interrupted`` and the binary text events our nodes send). Checks (issue 15's numbering):

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

What it builds and reads (prompts, events, logs, the verdict) is bench/comfyui_e2e_reading.py's, the
ComfyUI process and its websocket bench/comfyui_process.py's; this file is the run and its checks.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Optional

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

from comfyui_e2e_reading import (ANSI, I2V, PKG, STEP, T2V, build_prompt, count_jobs, executed_nodes,  # noqa: E402
                                 load_api, node_of, output_files, planner_prediction, probe_values, server_times,
                                 summarize_progress, verdict)

sys.path.insert(1, str(PKG / "tests" / "comfyui"))      # comfy_harness, after bench/ as before

from comfy_harness import comfyui_version  # noqa: E402
from comfyui_process import Comfy, Websocket, process_state, server_env_var  # noqa: E402
from gpu.common import NOT_ON_CPU, Gpu  # noqa: E402


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
        job["planner"] = planner_prediction(self.base / "models" / "diffusers" / self.args.model_folder,
                                            prompt[gen]["inputs"], [self.args.cpu_gpu_gib] if self.args.cpu else None)
        job["local_server_texts"] = local_texts[-3:]
        peak = self.gpu.peak_mib(t0, t_end)
        job["nvml_peak_mib"] = peak
        job["nvml_peak_gib"] = round(peak / 1024, 2) if isinstance(peak, int) else peak
        if gen_start is not None and gen in ran:
            job["generate_node_wall_s"] = round(gen_end - gen_start, 3)
            if times:
                job["server_times"] = times[-1]
                job["overhead_s"] = round(job["generate_node_wall_s"] - times[-1]["server_s"], 3)
        job.update(output_files(self.base, outputs))
        self.report.setdefault("jobs", {})[name] = job
        return job

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
            "log_tail": [ln for ln in ANSI.sub("", self.server_log_text()).splitlines()
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
            alive = [p for p in pids if Path(f"/proc/{p}").exists() and process_state(p) != "Z"]
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
