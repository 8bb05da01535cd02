"""Issue 26 section 1: ComfyUI's native Wan2.2 workflow beside our template, in ONE ComfyUI, same request
(`--family` ti2v-5b, the default, or t2v-a14b; the graphs: bench/gpu/graphs.py). Both end in the same sink:
the IMAGE into Get Image Size -> Preview Any (width, height, batch): no MP4 is written by either graph (our
server's MP4 encode is part of our path and counted); a few frames go to PNG for the PSNR drift.

Per side, each run timed from ComfyUI's websocket (node start times, the sampler's per-step progress) and,
for ours, the server's own stage timing and MP4 lines and Generate Video's job line in ComfyUI's log (the
server's `inference_time_s`, the client's frames-ready time: the node's overhead, direct): first run (files to
frames), a warm run (new seed and prompt, so the text encoder runs again), 20 steps; NVML peak of the whole GPU
and host RSS (ComfyUI's process and the server's) per run. Between the sides ComfyUI's `/free` unloads its
models and Stop Server stops ours.
"""
from __future__ import annotations

import argparse
import json
import re
import time
import uuid
from pathlib import Path
from typing import Any, Optional

from .common import (Deadline, Gpu, RamSampler, engine_e2e_s, load_frames, machine, mp4_encode_s,
                     postprocess_s, psnr, save_json, stage_timings)
from .families import FAMILIES, family
from .graphs import (AUTO_VARIANTS, DECODE, FAST_VARIANTS, KSAMPLER, NATIVE_VARIANTS, NEGATIVE, OURS_VARIANTS,
                     PROMPT, RECIPES, SETUPS, SINK, legacy, native_prompt, ours_prompt, sample_frames, serving_of)

__all__ = ["DECODE", "KSAMPLER", "native_prompt", "ours_prompt"]     # the graphs, as the driver's tests read them

# Generate Video's INFO line in ComfyUI's log (nodes/session.py `generate_video`): the job's server and client times
JOB_DONE = re.compile(r"vLLM-Omni job done: .*?; (?:the server's own time (?P<server>[\d.]+) s|the server gave no "
                      r"time), frames ready (?P<ready>[\d.]+) s after submit")


def job_done_times(text: str) -> list[dict[str, Optional[float]]]:
    """Each Generate Video job's line in this ComfyUI log text: `server_inference_s` (the server's job status
    `inference_time_s`; None where it gave none) and `frames_ready_s` (the client's `decoded`, from submit)."""
    return [{"server_inference_s": None if m["server"] is None else float(m["server"]),
             "frames_ready_s": float(m["ready"])} for m in JOB_DONE.finditer(text)]


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


def samplers_steps(events: list[dict], prompt_id: str, nodes: tuple[str, ...]) -> dict[str, Any]:
    """`sampler_steps` over one or more samplers in turn (A14B: the high- then the low-noise expert): time to
    the first sampler's first step, and s/step over every sampler's first-to-last step interval (each
    sampler's own first step holds its expert's load, so it is left out of the rate)."""
    each = [sampler_steps(events, prompt_id, n) for n in nodes]
    if len(each) == 1:
        return each[0]
    spans = [(s["s_per_step"] * (s["steps_seen"] - 1)) for s in each if s.get("s_per_step") is not None]
    intervals = sum(s["steps_seen"] - 1 for s in each if s.get("s_per_step") is not None)
    return {"steps_seen": sum(s["steps_seen"] for s in each), "to_first_step_s": each[0].get("to_first_step_s"),
            "s_per_step": round(sum(spans) / intervals, 4) if intervals else None,
            "per_sampler": dict(zip(nodes, each))}


def sink_values(outputs: dict) -> dict[str, Optional[float]]:
    vals: dict[str, Optional[float]] = {}
    for node in ("91", "92", "93"):
        text = (outputs.get(node) or {}).get("text") or [None]
        try:
            vals[SINK[node]] = float(text[0])
        except (TypeError, ValueError):
            vals[SINK[node]] = None
    return vals


def variant_prompt(family_name: str, side: str, variant: str, request: dict, model: str,
                   weight_dtype: str = "default", serving: Optional[dict] = None) -> tuple[dict, list]:
    """One run's graph of `side` ("native" or "ours") for `variant` and the IMAGE output it samples frames
    from: the family's graph and sampling settings, or a recipe variant's own (the 4-step LoRA pair: its cfg,
    shift, LoRA loaders, our LoRA template); `serving`: Serving Config overrides (ours)."""
    st = SETUPS[family_name]
    rec = RECIPES.get(variant, {})
    if rec and rec["family"] != family_name:
        raise ValueError(f"variant {variant} is a {rec['family']} graph, not {family_name}'s (--family)")
    cfg, shift = rec.get("cfg", st["cfg"]), rec.get("shift", st["shift"])
    if side == "native":
        v = NATIVE_VARIANTS[variant]
        prompt = st["native"](request, weight_dtype=v.get("weight_dtype", weight_dtype), easycache=v.get("easycache"),
                              cfg=cfg, shift=shift, **({"loras": rec["loras"]} if rec else {}))
        return prompt, [DECODE, 0]
    lg = legacy()
    prompt = ours_prompt(lg.load_api(rec.get("template", st["template"])), model, request,
                         serving=dict(serving_of(variant), **(serving or {})), guidance=cfg, shift=shift,
                         sampler=st["ours_sampler"], guidance_2=None if st["guidance_2"] is None else cfg)
    return prompt, [lg.node_of(prompt, "VLLMOmniGenerateVideo"), 0]


class HeadToHead:
    def __init__(self, args: argparse.Namespace) -> None:
        self.a = args
        self.fam = family(args.family)
        self.setup = SETUPS[self.fam.name]
        for key in ("width", "height", "frames", "fps", "step_guess_s", "first_s"):
            if getattr(args, key) is None:
                setattr(args, key, self.setup[key])
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
                "fps": a.fps, "steps": steps, "seed": a.seed + take}

    def comfy_env(self) -> dict[str, str]:
        """ComfyUI's environment beyond this process's: the launcher's data folder and local settings."""
        env = {"VLLM_OMNI_LAUNCHER_DATA_DIR": str(self.data_dir)}
        if self.a.launcher_env:
            env.update(json.loads(Path(self.a.launcher_env).read_text()))
        return env

    def start(self) -> None:
        env = self.comfy_env()
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

    def comfy_log_text(self) -> str:
        """ComfyUI's own console (stdout and stderr, appended to <base>/comfyui.log): Generate Video's job line."""
        path = Path(self.comfy.log_path)
        return path.read_text(errors="replace") if path.is_file() else ""

    def queue(self, prompt: dict) -> str:
        status, body = self.comfy.post("/prompt", {"prompt": prompt, "client_id": self.client_id})
        if status != 200 or body.get("node_errors"):
            raise RuntimeError(f"/prompt refused the graph: {status} {json.dumps(body)[:3000]}")
        return body["prompt_id"]

    def execute(self, prompt: dict, timeout: float) -> tuple[str, dict, list, float, float, float]:
        """Queue one graph and wait for it: its prompt id, history entry, websocket events, and the times it was
        queued, seen finished here, and finished by ComfyUI's own event."""
        first = len(self.ws.snapshot())
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
        return pid, entry, events, t0, t1, done

    def run(self, side: str, label: str, steps: int, prompt: dict, timeout: float) -> dict:
        log_before, comfy_before = len(self.server_log_text()), len(self.comfy_log_text())
        pid, entry, events, t0, t1, done = self.execute(prompt, timeout)
        status = entry.get("status", {})
        result: dict[str, Any] = {
            "side": side, "run": label, "steps": steps,
            "status": status.get("status_str"), "end_to_end_s": round(done - t0, 3),
            "node_s": node_times(events, pid), "sink": sink_values(entry.get("outputs", {})),
            "nvml_peak_mib": self.gpu.peak_mib(t0, t1), "host_ram": self.ram.peak_gib(t0, t1) if self.ram else None}
        if status.get("status_str") == "error":
            result["error"] = [m for m in status.get("messages", []) if m[0] == "execution_error"]
        if side == "native":
            result["sampler"] = samplers_steps(events, pid, self.setup["samplers"])
        else:
            text = self.server_log_text()[log_before:]
            stages, mp4, post, e2e = stage_timings(text), mp4_encode_s(text), postprocess_s(text), engine_e2e_s(text)
            result["server_stages"] = stages[-1] if stages else None
            result["server_mp4_encode_s"] = mp4[-1] if mp4 else None
            result["server_postprocess_s"] = post[-1] if post else None
            result["server_engine_e2e_s"] = e2e[-1] if e2e else None
            jobs = job_done_times(self.comfy_log_text()[comfy_before:])     # the node's own job: direct times
            result.update(jobs[-1] if jobs else {"server_inference_s": None, "frames_ready_s": None})
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
        model = f"local/{a.model_folder or self.fam.diffusers_folder}"
        variants = (a.native_variants if side == "native" else a.ours_variants).split(",")

        def build(variant: str, label: str, steps: int, take: int) -> dict:
            req = self.request(steps, take)
            prompt, image = variant_prompt(self.fam.name, side, variant, req, model, a.weight_dtype,
                                           json.loads(a.serving) if a.serving else None)
            return sample_frames(prompt, image, f"bench/{a.tag}{side}-{label}", req["frames"])

        runs = [(variants[0], "first", a.steps, 1)]
        for i, variant in enumerate(variants):
            if i and (side == "ours" or "weight_dtype" in NATIVE_VARIANTS[variant]):
                runs.append((variant, f"{variant}-warmup", a.steps, 10 + i))
            runs += [(variant, f"{variant}-{s}", s, 3) for s in a.more_steps]
        per_step = None
        for variant, label, steps, take in runs:
            fixed = a.first_s if label == "first" or (side == "ours" and label.endswith("warmup")) else 30.0
            need = fixed + steps * (per_step or a.step_guess_s) + reserve_s
            if not self.deadline.fits(need):
                info.setdefault("skipped", []).append(f"{label}: {self.deadline.left():.0f}s left, needs ~{need:.0f}s")
                self.save()
                continue
            try:
                r = self.run(side, label, steps, build(variant, label, steps, take),
                             timeout=self.deadline.left() - reserve_s)
                r["variant"] = variant
                r["pair"] = self.pair(side, variant, label, steps)
                self.save()
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

    def pair(self, side: str, variant: str, label: str, steps: int) -> str:
        """The row of the combined table this run belongs to: the speed settings (default, or fast: our
        `speed` fast levers against ComfyUI --fast; a recipe's own row such as lora4, the 4-step LoRA pair),
        the run kind and steps; the same on both sides."""
        fast = variant in FAST_VARIANTS if side == "ours" else "--fast" in self.a.comfy_arg
        kind = "first" if label == "first" else "warmup" if label.endswith("warmup") else "warm"
        recipe = RECIPES.get(variant, {}).get("pair")
        speed = "-".join(filter(None, (recipe, "fast" if fast else None))) or "default"
        return f"{speed} {kind} {steps} steps"

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
            self.close()
        return 0 if "error" not in self.report else 1

    def close(self) -> None:
        """ComfyUI (and the server it launched) stopped, the samplers closed, the report saved."""
        if self.ws is not None:
            self.ws.close()
        if self.comfy is not None:
            self.comfy.stop()
        if self.ram is not None:
            self.ram.close()
        self.gpu.close()
        self.report["gpu_processes_at_end"] = self.gpu.processes()
        self.save()


def add_parser(sub: Any) -> None:
    p = sub.add_parser("native", help="ComfyUI native Wan2.2 vs our template in one ComfyUI (issue 26 s1)")
    p.add_argument("--family", choices=sorted(FAMILIES), default="ti2v-5b", help="the graphs, files and defaults")
    p.add_argument("--comfy-dir", required=True)
    p.add_argument("--python", required=True, help="ComfyUI's python")
    p.add_argument("--base", required=True, help="ComfyUI --base-directory (models/ from `weights`)")
    p.add_argument("--model-folder", help="our model under models/diffusers (default: the family's)")
    p.add_argument("--launcher-env", help="JSON: environment for ComfyUI (the launcher's local settings)")
    p.add_argument("--out", required=True)
    p.add_argument("--cpu", action="store_true", help="rehearsal: ComfyUI --cpu, no NVML")
    p.add_argument("--comfy-arg", action="append", default=[], help="one more ComfyUI flag (e.g. --fast)")
    p.add_argument("--sides", default="native,ours")
    p.add_argument("--width", type=int, help="default: the family's (TI2V-5B 1280, A14B 832)")
    p.add_argument("--height", type=int, help="default: the family's (704, 480)")
    p.add_argument("--frames", type=int, help="default: the family's (121, 81)")
    p.add_argument("--fps", type=int, help="default: the family's (24, 16)")
    p.add_argument("--first-s", type=float, help="seconds a first run (or our warm-up: a new server) takes beyond "
                   "its steps (default: the family's)")
    p.add_argument("--steps", type=int, default=4, help="steps of the first and warm runs")
    p.add_argument("--more-steps", type=lambda s: [int(x) for x in s.split(",") if x], default=[20])
    p.add_argument("--seed", type=int, default=41)
    p.add_argument("--weight-dtype", default="default", help="UNETLoader weight_dtype where a variant sets none")
    p.add_argument("--native-variants", default="default", help=f"of {', '.join(NATIVE_VARIANTS)}; the first "
                   "is the PSNR reference")
    p.add_argument("--ours-variants", default="eager", help=f"of {', '.join([*AUTO_VARIANTS, *OURS_VARIANTS])}; "
                   "the first is the PSNR reference")
    p.add_argument("--psnr-reference", help="the frames every variant is compared with, e.g. native-default (an "
                   "earlier ComfyUI of the same run); default: this side's first variant")
    p.add_argument("--reserve-s", type=float, default=200.0, help="seconds the first side leaves the second")
    p.add_argument("--tag", default="", help="prefix of the saved frames (two ComfyUI instances in one run)")
    p.add_argument("--serving", help="JSON: Serving Config overrides for our side")
    p.add_argument("--step-guess-s", type=float, help="s/step assumed before one is measured (default: the "
                   "family's)")
    p.add_argument("--detect", help="the `detect` phase's JSON, copied into the report")
    p.add_argument("--deadline-s", type=float, default=540.0)
    p.set_defaults(fn=lambda a: HeadToHead(a).main())
