"""Issue 30, GPU: one issue-30 pipeline end to end through our nodes in a real ComfyUI (`python -m bench.gpu
pipeline --pipeline NAME`), with the random real-size weights of `pipeline-weights`.

Three jobs on one server, each our template queued through ComfyUI's API (pipeline_graphs.py): `first` at the
template's shape (files to frames: Local Server starts the server), `warm` at the same shape (new seed and
prompt), `held-out` at the pipeline's held-out shape (larger in tokens, so the allocator's pool of the earlier
jobs cannot stand in for its peak). Per job: ComfyUI's node seconds (websocket), the server's own stage seconds
and denoise rate (its log: the DEBUG_PERF stage line where the pipeline prints one, else tqdm's s/it), the NVML
peak of the whole GPU, host RSS of ComfyUI and the server, and the planner's predicted peak for the same
request on the server the node launched (`planner_peak_gib`, `planner_error_pct`: the figures a family's
memory calibration is fitted and checked on; bench/results/h100-wan-pipelines-vllm-omni-0.30/). A job that would not fit before `--deadline-s` is skipped and named; the
server is stopped at the end (Stop Server) so the next call starts clean. ComfyUI's input folder gets the media
the templates' loaders name: control.mp4 (100 frames of 1280x720), speech.wav (3 s), example.png (ComfyUI's).
"""
from __future__ import annotations

import argparse
import json
import time
import uuid
from pathlib import Path
from typing import Any, Optional

from .common import Deadline, Gpu, RamSampler, import_package, last_step_rate, machine, stage_timings
from .graphs import legacy
from .native import HeadToHead, node_times, sink_values
from .pipeline_families import PIPELINES, latent_tokens, pipeline
from .pipeline_graphs import expected_frames, job_node, node_of, pipeline_prompt


def shape_arg(text: str) -> tuple[int, int, int]:
    w, h, f = (int(x) for x in text.lower().split("x"))
    return w, h, f


def put_inputs(input_dir: Path) -> None:
    """control.mp4 and speech.wav as the pack's own ComfyUI check makes them (tests/comfyui/comfy_harness.py)."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "comfyui"))
    import_package()
    from comfy_harness import put_media_inputs

    input_dir.mkdir(parents=True, exist_ok=True)
    put_media_inputs(input_dir)


def planner_peak(model_dir: Path, shape: tuple[int, int, int], serving: dict) -> dict[str, Any]:
    """The planner's peak for one request on the server Local Server launches (one GPU, the template's memory
    settings): the figure the run calibrates."""
    import_package()
    from vllm_omni_launcher.planner.memory import RequestShape, plan
    from vllm_omni_launcher.server.launch.spec import LaunchSpec, MemoryConfig

    try:
        spec = LaunchSpec(str(model_dir), gpus=(0,), memory=MemoryConfig(offload=serving.get("offload", "none"),
                                                                         vae_tiling=bool(serving.get("vae_tiling"))))
        got = plan(spec, RequestShape(*shape), host_available_gib=None)
        return {"planner_peak_gib": round(got.peak_gib, 2),
                "planner_terms": [t.to_dict() for t in got.gpus[0].terms] if got.gpus else None}
    except Exception as exc:    # the prediction is a measurement aid
        return {"planner_error": f"{type(exc).__name__}: {exc}"[:500]}


class PipelineBench(HeadToHead):
    """One pipeline's three jobs; ComfyUI's start, the queue, the server log, Stop Server and the shutdown are the
    head-to-head's (native.HeadToHead), whose family-specific __init__ this replaces."""

    def __init__(self, a: argparse.Namespace) -> None:     # not super()'s: that one reads a head-to-head family
        self.a = a
        self.p = pipeline(a.pipeline)
        self.shapes = {"template": a.shape or self.p.shape, "held-out": a.held_out or self.p.held_out}
        self.lg = legacy()
        self.deadline = Deadline(a.deadline_s)
        self.out, self.base = Path(a.out), Path(a.base)
        self.data_dir = self.base / "launcher-data"
        self.gpu = Gpu(not a.cpu)
        self.serving = json.loads(a.serving) if a.serving else {}
        self.report: dict[str, Any] = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                                       "machine": machine(), "args": vars(a), "pipeline": self.p.name,
                                       "family": self.p.family, "template": self.p.template,
                                       "shapes": {k: list(v) for k, v in self.shapes.items()},
                                       "tokens": {k: latent_tokens(self.p, v) for k, v in self.shapes.items()},
                                       "runs": [], "skipped": [], "errors": []}
        self.comfy: Any = None
        self.ws: Any = None
        self.ram: Optional[RamSampler] = None
        self.client_id = str(uuid.uuid4())

    def comfy_env(self) -> dict[str, str]:
        env = super().comfy_env()
        if (self.base / "hf-home").is_dir():     # S2V: the Wan2.1 VAE config diffusers' single-file loader reads
            env.setdefault("HF_HOME", str(self.base / "hf-home"))
        return env

    def start(self) -> None:
        put_inputs(self.base / "input")
        super().start()

    def job(self, label: str, shape: tuple[int, int, int], take: int) -> dict:
        prompt = pipeline_prompt(self.p, shape, self.a.steps, self.a.seed, take,
                                 f"bench/{self.a.tag}{self.p.name}-{label}", self.serving)
        gen = job_node(prompt)
        log_before = len(self.server_log_text())
        pid, entry, events, t0, t1, done = self.execute(prompt, self.deadline.left() - 10.0)
        status = entry.get("status", {})
        text = self.server_log_text()[log_before:]
        stages = stage_timings(text)
        peak = self.gpu.peak_mib(t0, t1)
        r: dict[str, Any] = {
            "run": label, "shape": list(shape), "tokens": latent_tokens(self.p, shape),
            "steps": None if self.p.family == "fastwan_ti2v_5b" else self.a.steps,
            "status": status.get("status_str"), "end_to_end_s": round(done - t0, 3),
            "node_s": node_times(events, pid), "sink": sink_values(entry.get("outputs", {})),
            "frames_expected": expected_frames(self.p, shape[2]),
            "nvml_peak_mib": peak, "nvml_peak_gib": round(peak / 1024, 2) if isinstance(peak, int) else peak,
            "host_ram": self.ram.peak_gib(t0, t1) if self.ram else None,
            "server_stages": stages[-1] if stages else None, "server_s_per_step_tqdm": last_step_rate(text),
            "generate_texts": [e["text"] for e in events if e["type"] == "text" and e["node"] == gen][-2:],
            "local_server_texts": [e["text"] for e in events if e["type"] == "text"
                                   and e["node"] == node_of(prompt, "VLLMOmniLocalServer")][-2:]}
        if stages and stages[-1].get("steps"):
            r["s_per_step"] = round(stages[-1]["denoise_s"] / stages[-1]["steps"], 4)
        else:
            r["s_per_step"] = r["server_s_per_step_tqdm"]
        if status.get("status_str") == "error":
            r["error"] = [m for m in status.get("messages", []) if m[0] == "execution_error"]
        r.update(planner_peak(self.base / "models" / "diffusers" / self.p.folder, shape,
                              prompt[node_of(prompt, "VLLMOmniServingConfig")]["inputs"]))
        if isinstance(r.get("nvml_peak_gib"), float) and r.get("planner_peak_gib"):
            r["planner_error_pct"] = round(100 * (r["planner_peak_gib"] - r["nvml_peak_gib"]) / r["nvml_peak_gib"], 1)
        self.report["runs"].append(r)
        self.save()
        print(json.dumps(r, default=str)[:2500], flush=True)
        return r

    def jobs(self) -> None:
        a, per_step = self.a, None
        steps = 3 if self.p.family == "fastwan_ti2v_5b" else a.steps
        plan = [("first", self.shapes["template"], 1), ("warm", self.shapes["template"], 2),
                ("held-out", self.shapes["held-out"], 3)]
        for label, shape, take in plan:
            need = ((a.first_s or self.p.first_s) if label == "first" else 30.0) + \
                steps * (per_step or a.step_guess_s or self.p.step_guess_s) + 25.0
            if not self.deadline.fits(need):
                self.report["skipped"].append(f"{label}: {self.deadline.left():.0f}s left, needs ~{need:.0f}s")
                self.save()
                continue
            try:
                r = self.job(label, shape, take)
            except Exception as exc:    # the report says what failed; the next job still runs
                self.report["errors"].append(f"{label}: {type(exc).__name__}: {exc}"[:3000])
                self.save()
                continue
            per_step = r.get("s_per_step") or per_step

    def main(self) -> int:
        try:
            self.start()
            self.jobs()
            self.report["release"] = self.stop_ours()
        except Exception as exc:
            self.report["error"] = f"{type(exc).__name__}: {exc}"[:6000]
        finally:
            self.close()
        ok = "error" not in self.report and not self.report["errors"] and \
            all(r.get("status") == "success" for r in self.report["runs"])
        return 0 if ok else 1


def add_parser(sub: Any) -> None:
    p = sub.add_parser("pipeline", help="issue 30: one VACE / S2V / FastWan pipeline through our template in "
                                         "ComfyUI (first, warm, held-out shape)")
    p.add_argument("--pipeline", choices=sorted(PIPELINES), required=True)
    p.add_argument("--comfy-dir", required=True)
    p.add_argument("--python", required=True, help="ComfyUI's python")
    p.add_argument("--base", required=True, help="ComfyUI --base-directory (models/ from `pipeline-weights`)")
    p.add_argument("--launcher-env", help="JSON: environment for ComfyUI (the launcher's local settings)")
    p.add_argument("--out", required=True)
    p.add_argument("--cpu", action="store_true", help="rehearsal: ComfyUI --cpu, no NVML")
    p.add_argument("--comfy-arg", action="append", default=[], help="one more ComfyUI flag")
    p.add_argument("--shape", type=shape_arg, help="WxHxF of the first and warm jobs (default: the template's; "
                   "S2V: F per clip)")
    p.add_argument("--held-out", type=shape_arg, help="WxHxF of the held-out job (default: the pipeline's)")
    p.add_argument("--steps", type=int, default=4, help="steps per job (FastWan: its own 3, whatever this says)")
    p.add_argument("--seed", type=int, default=41)
    p.add_argument("--serving", help="JSON: Serving Config overrides (default: the template's)")
    p.add_argument("--tag", default="", help="prefix of the saved frames")
    p.add_argument("--step-guess-s", type=float, help="s/step assumed before one is measured")
    p.add_argument("--first-s", type=float, help="seconds the first job takes beyond its steps (server start)")
    p.add_argument("--deadline-s", type=float, default=540.0)
    p.set_defaults(fn=lambda a: PipelineBench(a).main())
