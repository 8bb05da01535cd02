"""Issue 26 section 1: ComfyUI's native Wan2.2 TI2V-5B workflow beside our template, in ONE ComfyUI, same request.

Native (the graph of ComfyUI's "Wan2.2 5B" template, text-to-video: no start image): UNETLoader ->
ModelSamplingSD3 (shift 8) -> KSampler (uni_pc, simple, cfg 5) with CLIPLoader (type wan) -> CLIPTextEncode x2
and Wan22ImageToVideoLatent, then VAEDecode. Ours: workflows/api/wan22_ti2v_5b_text_to_video (Load Model ->
Serving Config -> Local Server -> Generate Video), guidance 5 and flow_shift 8 set to match, the server's UniPC
(flow) solver. Both end in the same sink: the IMAGE into Get Image Size -> Preview Any (width, height,
batch): no PNG or MP4 is written by either graph (our server's MP4 encode is part of our path and counted).

Per side, each run timed from ComfyUI's websocket (node start times, the sampler's per-step progress) and,
for ours, the server's own stage timing and MP4 lines: first run (files to frames), a warm run (new seed and
prompt, so the text encoder runs again), 20 steps; NVML peak of the whole GPU and host RSS (ComfyUI's process
and the server's) per run. Between the sides ComfyUI's `/free` unloads its models and Stop Server stops ours.
"""
from __future__ import annotations

import argparse
import json
import time
import uuid
from pathlib import Path
from typing import Any, Optional

from . import weights
from .common import (REPO, Deadline, Gpu, RamSampler, engine_e2e_s, load_frames, machine, mp4_encode_s,
                     postprocess_s, psnr, save_json, stage_timings)

PROMPT = ("A red fox trotting through fresh snow in a birch forest at sunrise, soft golden light, slow tracking "
          "shot, cinematic")
NEGATIVE = "blurry, low quality, distorted faces, jitter, flicker, watermark, text, static frame"
SINK = {"90": "GetImageSize", "91": "width", "92": "height", "93": "batch"}
KSAMPLER, DECODE = "3", "8"


def legacy() -> Any:
    """bench/gpu_comfyui_e2e.py (its Comfy, Websocket, load_api, node_of); it imports only gpu/common.py."""
    import sys

    sys.path.insert(0, str(REPO / "bench"))
    import gpu_comfyui_e2e

    return gpu_comfyui_e2e


def sink(prompt: dict, image: list) -> dict:
    """The bench sink on an IMAGE output: its size and frame count as Preview Any text, nothing encoded."""
    prompt["90"] = {"class_type": "GetImageSize", "inputs": {"image": image}}
    for slot, name in enumerate(("width", "height", "batch")):
        prompt[f"9{slot + 1}"] = {"class_type": "PreviewAny", "inputs": {"source": ["90", slot]},
                                  "_meta": {"title": name}}
    return prompt


# Native speed variants a user sets in the graph (ComfyUI flags such as --fast need a ComfyUI of their own:
# --comfy-arg): the UNET loader's fp8 weights, ComfyUI's EasyCache node at its defaults (verbose: its log
# says how many steps it skipped).
EASYCACHE = {"reuse_threshold": 0.2, "start_percent": 0.15, "end_percent": 0.95, "verbose": True}
NATIVE_VARIANTS: dict[str, dict[str, Any]] = {
    "default": {}, "fp8": {"weight_dtype": "fp8_e4m3fn"}, "easycache": {"easycache": EASYCACHE},
    "fp8_easycache": {"weight_dtype": "fp8_e4m3fn", "easycache": EASYCACHE}}
# Our variants: Serving Config widget values (the node's own speed settings; `compile` false = eager).
# parallel_mode none: exactly these settings (with auto the planner would use fp8 only where nothing else fits).
_EXACT = {"parallel_mode": "none", "offload": "none", "vae_tiling": False}
OURS_VARIANTS: dict[str, dict[str, Any]] = {name: dict(_EXACT, **v) for name, v in {
    "eager": {"compile": False}, "compile": {"compile": True},
    "cache_dit": {"compile": False, "cache_backend": "cache_dit"}, "fp8": {"compile": False, "fp8": True},
    "fp8_cache_dit": {"compile": False, "fp8": True, "cache_backend": "cache_dit"},
    "compile_cache_dit": {"compile": True, "cache_backend": "cache_dit"},
    "compile_fp8_cache_dit": {"compile": True, "fp8": True, "cache_backend": "cache_dit"}}.items()}
SAMPLE_FROM, SAMPLE_FRAMES = 40, 4      # frames saved as PNG per run (the PSNR drift between variants)


def sample_frames(prompt: dict, image: list, prefix: str, frames: int) -> dict:
    """A few frames of the run's IMAGE saved as PNG (ImageFromBatch -> SaveImage) for the PSNR drift."""
    start = min(SAMPLE_FROM, max(0, frames - SAMPLE_FRAMES))
    prompt["94"] = {"class_type": "ImageFromBatch", "inputs": {"image": image, "batch_index": start,
                                                                "length": min(SAMPLE_FRAMES, frames)}}
    prompt["95"] = {"class_type": "SaveImage", "inputs": {"images": ["94", 0], "filename_prefix": prefix}}
    return prompt


def native_prompt(request: dict, *, weight_dtype: str = "default", shift: float = 8.0, cfg: float = 5.0,
                  sampler: str = "uni_pc", scheduler: str = "simple", easycache: Optional[dict] = None) -> dict:
    """ComfyUI's Wan2.2 5B template graph (API format), text-to-video, ending in the sink; `easycache`:
    ComfyUI's EasyCache node between the model sampling patch and the sampler, with these inputs."""
    r = request
    files = {k: name for k, (_, name) in weights.COMFY_FILES.items()}
    prompt = {
        "37": {"class_type": "UNETLoader", "inputs": {"unet_name": files["unet"], "weight_dtype": weight_dtype}},
        "38": {"class_type": "CLIPLoader", "inputs": {"clip_name": files["te"], "type": "wan", "device": "default"}},
        "39": {"class_type": "VAELoader", "inputs": {"vae_name": files["vae"]}},
        "48": {"class_type": "ModelSamplingSD3", "inputs": {"model": ["37", 0], "shift": shift}},
        "6": {"class_type": "CLIPTextEncode", "inputs": {"text": r["prompt"], "clip": ["38", 0]}},
        "7": {"class_type": "CLIPTextEncode", "inputs": {"text": r["negative"], "clip": ["38", 0]}},
        "55": {"class_type": "Wan22ImageToVideoLatent",
               "inputs": {"vae": ["39", 0], "width": r["width"], "height": r["height"], "length": r["frames"],
                          "batch_size": 1}},
        KSAMPLER: {"class_type": "KSampler",
                   "inputs": {"model": ["49", 0] if easycache else ["48", 0], "positive": ["6", 0],
                              "negative": ["7", 0],
                              "latent_image": ["55", 0], "seed": r["seed"], "steps": r["steps"], "cfg": cfg,
                              "sampler_name": sampler, "scheduler": scheduler, "denoise": 1.0}},
        DECODE: {"class_type": "VAEDecode", "inputs": {"samples": [KSAMPLER, 0], "vae": ["39", 0]}},
    }
    if easycache:
        prompt["49"] = {"class_type": "EasyCache", "inputs": dict(easycache, model=["48", 0])}
    return sink(prompt, [DECODE, 0])


def ours_prompt(template: dict, model: str, request: dict, serving: Optional[dict] = None,
                guidance: float = 5.0, shift: float = 8.0) -> dict:
    """Our TI2V-5B text-to-video template pointed at `model`, the same request, Generate's IMAGE into the sink."""
    lg = legacy()
    prompt = json.loads(json.dumps(template))
    prompt[lg.node_of(prompt, "VLLMOmniLoadModel")]["inputs"]["model"] = model
    prompt[lg.node_of(prompt, "VLLMOmniServingConfig")]["inputs"].update(serving or {})
    gen = lg.node_of(prompt, "VLLMOmniGenerateVideo")
    r = request
    prompt[gen]["inputs"].update(prompt=r["prompt"], negative_prompt=r["negative"], width=r["width"],
                                 height=r["height"], frames=r["frames"], fps=r["fps"], steps=r["steps"],
                                 seed=r["seed"], guidance=guidance, flow_shift=shift, sampler="unipc")
    for key in [k for k, e in prompt.items() if e["class_type"] in ("SaveVideo", "SaveImage")]:
        del prompt[key]
    return sink(prompt, [gen, 0])


def node_times(events: list[dict], prompt_id: str) -> dict[str, float]:
    """Seconds each node ran, from consecutive websocket `executing` events (one node at a time)."""
    marks = [(e["t"], e["data"].get("node")) for e in events if e["type"] == "executing"
             and e["data"].get("prompt_id") == prompt_id]
    out: dict[str, float] = {}
    for (t0, node), (t1, _) in zip(marks, marks[1:]):
        if node is not None:
            out[str(node)] = round(out.get(str(node), 0.0) + t1 - t0, 3)
    return out


def sampler_steps(events: list[dict], prompt_id: str, node: str) -> dict[str, Any]:
    """The sampler's per-step progress: time to its first step (model load to GPU + step 1) and the
    steady seconds per step (first to last step event)."""
    start = next((e["t"] for e in events if e["type"] == "executing" and e["data"].get("prompt_id") == prompt_id
                  and str(e["data"].get("node")) == node), None)
    ticks: dict[int, float] = {}
    for e in events:
        d = e["data"]
        if e["type"] == "progress" and str(d.get("node")) == node and d.get("prompt_id", prompt_id) == prompt_id:
            ticks.setdefault(int(d.get("value", 0)), e["t"])
    steps = sorted(k for k in ticks if k > 0)
    if start is None or not steps:
        return {"steps_seen": len(steps)}
    first, last = steps[0], steps[-1]
    rate = (ticks[last] - ticks[first]) / (last - first) if last > first else None
    return {"steps_seen": len(steps), "to_first_step_s": round(ticks[first] - start, 3),
            "s_per_step": None if rate is None else round(rate, 4)}


def sink_values(outputs: dict) -> dict[str, Optional[float]]:
    vals: dict[str, Optional[float]] = {}
    for node in ("91", "92", "93"):
        text = (outputs.get(node) or {}).get("text") or [None]
        try:
            vals[SINK[node]] = float(text[0])
        except (TypeError, ValueError):
            vals[SINK[node]] = None
    return vals


class HeadToHead:
    def __init__(self, args: argparse.Namespace) -> None:
        self.a = args
        self.lg = legacy()
        self.deadline = Deadline(args.deadline_s)
        self.out = Path(args.out)
        self.base = Path(args.base)
        self.data_dir = self.base / "launcher-data"
        self.gpu = Gpu(not args.cpu)
        self.report: dict[str, Any] = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                                       "machine": machine(), "args": vars(args), "runs": [], "sides": {}}
        self.comfy: Any = None
        self.ws: Any = None
        self.ram: Optional[RamSampler] = None
        self.client_id = str(uuid.uuid4())

    # -- plumbing -------------------------------------------------------------------------
    def save(self) -> None:
        self.report["elapsed_s"] = round(self.a.deadline_s - self.deadline.left(), 1)
        save_json(self.out / "report.json", self.report)

    def request(self, steps: int, take: int) -> dict:
        a = self.a
        tag = "" if take == 1 else f", take {take}"    # a new text: both encoders run again, loaders stay cached
        return {"prompt": PROMPT + tag, "negative": NEGATIVE + tag, "width": a.width, "height": a.height, "frames": a.frames,
                "fps": 24, "steps": steps, "seed": a.seed + take}

    def start(self) -> None:
        env = {"VLLM_OMNI_LAUNCHER_DATA_DIR": str(self.data_dir)}
        if self.a.launcher_env:
            env.update(json.loads(Path(self.a.launcher_env).read_text()))
        t0 = time.monotonic()
        self.comfy = self.lg.Comfy(Path(self.a.comfy_dir), self.a.python, env, self.base, self.a.cpu,
                                   tuple(self.a.comfy_arg))
        self.comfy.wait_ready(timeout=240)
        self.report["comfyui_ready_s"] = round(time.monotonic() - t0, 2)
        self.report["nvml_mib_comfyui_idle"] = self.gpu.peak_mib(time.monotonic() - 1.0)
        self.ws = self.lg.Websocket(self.comfy.url, self.client_id)
        self.ram = RamSampler(self.comfy.proc.pid)

    def server_log_text(self) -> str:
        d = self.data_dir / "logs"
        if not d.is_dir():   # oldest first, so the text only grows at its end while a server writes
            return ""
        return "".join(p.read_text(errors="replace") for p in sorted(d.glob("*.log"), key=lambda p: p.stat().st_mtime))

    def queue(self, prompt: dict) -> str:
        status, body = self.comfy.post("/prompt", {"prompt": prompt, "client_id": self.client_id})
        if status != 200 or body.get("node_errors"):
            raise RuntimeError(f"/prompt refused the graph: {status} {json.dumps(body)[:3000]}")
        return body["prompt_id"]

    def run(self, side: str, label: str, steps: int, prompt: dict, timeout: float) -> dict:
        first = len(self.ws.snapshot())
        log_before = len(self.server_log_text())
        t0 = time.monotonic()
        pid = self.queue(prompt)
        try:
            entry = self.comfy.wait_history(pid, timeout=timeout, poll=0.1)
        except TimeoutError:
            self.comfy.interrupt()      # out of time: free ComfyUI's queue for what comes next
            raise
        t1 = time.monotonic()
        events = self.ws.snapshot()[first:]
        done = next((e["t"] for e in events if e["type"] in ("execution_success", "execution_error")
                     and e["data"].get("prompt_id") == pid), t1)
        status = entry.get("status", {})
        result: dict[str, Any] = {
            "side": side, "run": label, "steps": steps,
            "status": status.get("status_str"), "end_to_end_s": round(done - t0, 3),
            "node_s": node_times(events, pid), "sink": sink_values(entry.get("outputs", {})),
            "nvml_peak_mib": self.gpu.peak_mib(t0, t1), "host_ram": self.ram.peak_gib(t0, t1) if self.ram else None}
        if status.get("status_str") == "error":
            result["error"] = [m for m in status.get("messages", []) if m[0] == "execution_error"]
        if side == "native":
            result["sampler"] = sampler_steps(events, pid, KSAMPLER)
        else:
            text = self.server_log_text()[log_before:]
            stages, mp4, post, e2e = stage_timings(text), mp4_encode_s(text), postprocess_s(text), engine_e2e_s(text)
            result["server_stages"] = stages[-1] if stages else None
            result["server_mp4_encode_s"] = mp4[-1] if mp4 else None
            result["server_postprocess_s"] = post[-1] if post else None
            result["server_engine_e2e_s"] = e2e[-1] if e2e else None
            gen = self.lg.node_of(prompt, "VLLMOmniGenerateVideo")
            result["generate_texts"] = [e["text"] for e in events if e["type"] == "text" and e["node"] == gen][-2:]
            result["local_server_texts"] = [e["text"] for e in events if e["type"] == "text"
                                            and e["node"] == self.lg.node_of(prompt, "VLLMOmniLocalServer")][-2:]
        self.report["runs"].append(result)
        self.save()
        print(json.dumps(result, default=str)[:2500], flush=True)
        return result

    def free_native(self) -> dict:
        """ComfyUI's own "unload models + free memory", then the GPU settled (NVML within 1 GiB)."""
        t0 = time.monotonic()
        status, _ = self.comfy.post("/free", {"unload_models": True, "free_memory": True})
        time.sleep(3.0)     # /free is handled between prompts; give the executor its turn
        return {"status": status, "nvml_mib_after": self.gpu.peak_mib(time.monotonic() - 0.5),
                "seconds": round(time.monotonic() - t0, 2)}

    def stop_ours(self) -> dict:
        t0 = time.monotonic()
        pid = self.queue({"1": {"class_type": "VLLMOmniStopServer", "inputs": {"stop_all": True}}})
        self.comfy.wait_history(pid, timeout=120, poll=0.2)
        time.sleep(2.0)
        return {"seconds": round(time.monotonic() - t0, 2), "gpu_processes_after": self.gpu.processes(),
                "nvml_mib_after": self.gpu.peak_mib(time.monotonic() - 0.5)}

    # -- the sides ------------------------------------------------------------------------
    def side(self, side: str, reserve_s: float) -> None:
        """`first` (a.steps, the first variant: files to frames), then per variant a warm-up where the
        variant reloads or restarts something (native fp8 weights: the UNET reloads; ours: every variant is
        another server), then each of a.more_steps with the same seed and texts for every variant (so the
        PSNR of their frames compares like with like), skipping what would not fit before `reserve_s`."""
        a = self.a
        info: dict[str, Any] = {"nvml_mib_before": self.gpu.peak_mib(time.monotonic() - 0.5)}
        self.report["sides"][side] = info
        template = self.lg.load_api(self.lg.T2V)
        model = f"local/{a.model_folder}"
        variants = (a.native_variants if side == "native" else a.ours_variants).split(",")

        def build(variant: str, label: str, steps: int, take: int) -> dict:
            req = self.request(steps, take)
            if side == "native":
                v = NATIVE_VARIANTS[variant]
                prompt = native_prompt(req, weight_dtype=v.get("weight_dtype", a.weight_dtype),
                                       easycache=v.get("easycache"))
                image = [DECODE, 0]
            else:
                serving = dict(OURS_VARIANTS[variant], **(json.loads(a.serving) if a.serving else {}))
                prompt = ours_prompt(template, model, req, serving=serving)
                image = [self.lg.node_of(prompt, "VLLMOmniGenerateVideo"), 0]
            return sample_frames(prompt, image, f"bench/{a.tag}{side}-{label}", req["frames"])

        runs = [(variants[0], "first", a.steps, 1)]
        for i, variant in enumerate(variants):
            if i and (side == "ours" or "weight_dtype" in NATIVE_VARIANTS[variant]):
                runs.append((variant, f"{variant}-warmup", a.steps, 10 + i))
            runs += [(variant, f"{variant}-{s}", s, 3) for s in a.more_steps]
        per_step = None
        for variant, label, steps, take in runs:
            fixed = 90.0 if label == "first" or (side == "ours" and label.endswith("warmup")) else 30.0
            need = fixed + steps * (per_step or a.step_guess_s) + reserve_s
            if not self.deadline.fits(need):
                info.setdefault("skipped", []).append(f"{label}: {self.deadline.left():.0f}s left, needs ~{need:.0f}s")
                self.save()
                continue
            try:
                r = self.run(side, label, steps, build(variant, label, steps, take),
                             timeout=self.deadline.left() - reserve_s)
                r["variant"] = variant
            except Exception as exc:   # the report says what failed; the other side still runs
                info.setdefault("errors", []).append(f"{label}: {type(exc).__name__}: {exc}"[:3000])
                self.save()
                continue
            rate = (r.get("sampler") or {}).get("s_per_step")
            stages = r.get("server_stages") or {}
            if stages.get("steps"):
                rate = stages["denoise_s"] / stages["steps"]
            per_step = rate or per_step
        info["psnr_db"] = self.drift(side, variants)
        info["release"] = self.free_native() if side == "native" else self.stop_ours()
        self.save()

    def drift(self, side: str, variants: list[str]) -> dict[str, Any]:
        """PSNR of each variant's saved frames against the first variant's, per step count."""
        out: dict[str, Any] = {}
        folder = self.base / "output" / "bench"
        for s in self.a.more_steps:
            ref_name = (self.a.psnr_reference or f"{self.a.tag}{side}-{variants[0]}") + f"-{s}"
            ref = load_frames(folder, ref_name)
            for v in variants if self.a.psnr_reference else variants[1:]:
                got = load_frames(folder, f"{self.a.tag}{side}-{v}-{s}")
                out[f"{self.a.tag}{v}-{s} vs {ref_name}"] = psnr(got, ref)
        return out

    def main(self) -> int:
        try:
            self.start()
            if self.a.detect:
                self.report["detect"] = json.loads(Path(self.a.detect).read_text())
            order = self.a.sides.split(",")
            for i, side in enumerate(order):
                reserve = self.a.reserve_s if i + 1 < len(order) else 15.0    # keep time for the other side's runs
                self.side(side, reserve)
        except Exception as exc:
            self.report["error"] = f"{type(exc).__name__}: {exc}"[:6000]
        finally:
            if self.ws is not None:
                self.ws.close()
            if self.comfy is not None:
                self.comfy.stop()
            if self.ram is not None:
                self.ram.close()
            self.gpu.close()
            self.report["gpu_processes_at_end"] = self.gpu.processes()
            self.save()
        return 0 if "error" not in self.report else 1


def add_parser(sub: Any) -> None:
    p = sub.add_parser("native", help="ComfyUI native Wan2.2 5B vs our template in one ComfyUI (issue 26 s1)")
    p.add_argument("--comfy-dir", required=True)
    p.add_argument("--python", required=True, help="ComfyUI's python")
    p.add_argument("--base", required=True, help="ComfyUI --base-directory (models/ from `weights`)")
    p.add_argument("--model-folder", default=weights.DIFFUSERS_FOLDER, help="our model under models/diffusers")
    p.add_argument("--launcher-env", help="JSON: environment for ComfyUI (the launcher's local settings)")
    p.add_argument("--out", required=True)
    p.add_argument("--cpu", action="store_true", help="rehearsal: ComfyUI --cpu, no NVML")
    p.add_argument("--comfy-arg", action="append", default=[], help="one more ComfyUI flag (e.g. --fast)")
    p.add_argument("--sides", default="native,ours")
    p.add_argument("--width", type=int, default=1280)
    p.add_argument("--height", type=int, default=704)
    p.add_argument("--frames", type=int, default=121)
    p.add_argument("--steps", type=int, default=4, help="steps of the first and warm runs")
    p.add_argument("--more-steps", type=lambda s: [int(x) for x in s.split(",") if x], default=[20])
    p.add_argument("--seed", type=int, default=41)
    p.add_argument("--weight-dtype", default="default", help="UNETLoader weight_dtype where a variant sets none")
    p.add_argument("--native-variants", default="default", help=f"of {', '.join(NATIVE_VARIANTS)}; the first "
                   "is the PSNR reference")
    p.add_argument("--ours-variants", default="eager", help=f"of {', '.join(OURS_VARIANTS)}; the first is the "
                   "PSNR reference")
    p.add_argument("--psnr-reference", help="the frames every variant is compared with, e.g. native-default (an "
                   "earlier ComfyUI of the same run); default: this side's first variant")
    p.add_argument("--reserve-s", type=float, default=200.0, help="seconds the first side leaves the second")
    p.add_argument("--tag", default="", help="prefix of the saved frames (two ComfyUI instances in one run)")
    p.add_argument("--serving", help="JSON: Serving Config overrides for our side")
    p.add_argument("--step-guess-s", type=float, default=3.0, help="s/step assumed before one is measured")
    p.add_argument("--detect", help="the `detect` phase's JSON, copied into the report")
    p.add_argument("--deadline-s", type=float, default=540.0)
    p.set_defaults(fn=lambda a: HeadToHead(a).main())
