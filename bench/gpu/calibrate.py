"""Issue 25: the 0.30 memory and speed calibration through our Supervisor and client, and the allocator-cap checks.

One server per configuration (offload none / layerwise / module, each without and with VAE tiling; eager, one
GPU), the shapes in ascending token order (an allocator keeps what a job reserved, so a smaller job after a
larger one would read the larger one's peak). Per job: NVML peak of the whole GPU during the job (sampled every
0.2 s), the planner's predicted peak for the same spec and request, the server's stage seconds (text encode,
denoise, VAE decode; the device setup turns vllm-omni's DEBUG_PERF timing line on), MP4 encode, s/step from
our log parser, job wall time. `--held-back` marks shapes kept out of the fit (the report says which).

Caps (`--caps`): after a configuration's uncapped jobs, jobs under the allocator cap (the GPU kit's
vol_memcap: VOL_MEMCAP_FILE names a file holding GiB; every server process applies it) emulate a smaller
card: fits or not (out of memory), peak, time. A job that fails is recorded and the next one runs; a server
that dies ends that configuration.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any, Optional

from .common import (Deadline, Gpu, ServerRun, import_package, machine, mp4_encode_s, save_json, server_command,
                     server_extra_env, stage_timings)

CONFIGS = {"none": ("none", False), "tiling": ("none", True), "layerwise": ("layerwise", False),
           "layerwise_tiling": ("layerwise", True), "module": ("module", False), "module_tiling": ("module", True)}
SHAPES = "832x480x49,832x480x81,1024x576x97,1280x704x121"
HELD_BACK = "1024x576x97"
# card (GiB the allocator may take) @ shape, per configuration: each card's expected pick and the
# configurations that would be faster, at the two shapes issue 25 names
CAPS = ("tiling:23.25@832x480x81;layerwise:23.25@832x480x81,23.25@1280x704x121,15.25@832x480x81,"
        "15.25@1280x704x121;layerwise_tiling:15.25@832x480x81,15.25@1280x704x121;"
        "module:23.25@832x480x81,23.25@1280x704x121,15.25@832x480x81")
PROMPT = "a red fox running through snow"


def parse_shapes(text: str) -> list[tuple[int, int, int]]:
    shapes = [tuple(int(x) for x in s.split("x")) for s in text.split(",") if s]
    return sorted(shapes, key=lambda s: ((s[2] - 1) // 4 + 1) * s[0] * s[1])   # type: ignore[return-value]


def parse_caps(text: str) -> dict[str, list[tuple[float, tuple[int, int, int]]]]:
    out: dict[str, list[tuple[float, tuple[int, int, int]]]] = {}
    for part in filter(None, text.split(";")):
        name, jobs = part.split(":", 1)
        out[name] = [(float(cap), tuple(int(x) for x in shape.split("x")))   # type: ignore[misc]
                     for cap, shape in (j.split("@") for j in jobs.split(","))]
    return out


def shape_text(shape: tuple[int, int, int]) -> str:
    return "x".join(map(str, shape))


class Calibration:
    def __init__(self, a: argparse.Namespace) -> None:
        self.a = a
        self.deadline = Deadline(a.deadline_s)
        self.out = Path(a.out)
        import_package()
        self.gpu = Gpu(not a.cpu)
        self.cap_file = Path(a.data_dir) / "memcap-gib"
        self.cap_file.parent.mkdir(parents=True, exist_ok=True)
        self.cap_file.write_text("0")
        self.report: dict[str, Any] = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                                       "machine": machine(), "args": vars(a), "held_back": a.held_back.split(","),
                                       "configs": []}

    def save(self) -> None:
        self.report["elapsed_s"] = round(self.a.deadline_s - self.deadline.left(), 1)
        save_json(self.out / "calibration.json", self.report)

    def set_cap(self, gib: float) -> None:
        """Write the cap and give each server process's watcher (0.2 s poll) time to apply it."""
        self.cap_file.write_text(f"{gib:g}")
        time.sleep(1.0)

    def job(self, sup: Any, client: Any, spec: Any, shape: tuple[int, int, int], cap: Optional[float]) -> dict:
        from vllm_omni_launcher.client.api import VideoRequest
        from vllm_omni_launcher.planner.memory import RequestShape, plan

        w, h, f = shape
        entry: dict[str, Any] = {"shape": [w, h, f], "steps": self.a.steps, "cap_gib": cap}
        try:
            entry["planner_peak_gib"] = round(plan(spec, RequestShape(w, h, f), host_available_gib=None).peak_gib, 2)
        except Exception as exc:   # the prediction is a measurement aid
            entry["planner_error"] = f"{type(exc).__name__}: {exc}"[:500]
        log_before = self.log_text(sup)
        stages_before, mp4_before = len(stage_timings(log_before)), len(mp4_encode_s(log_before))
        t0 = time.monotonic()
        try:
            result = client.generate(VideoRequest(prompt=PROMPT, width=w, height=h, num_frames=f, fps=24.0,
                                                  steps=self.a.steps, seed=7))
            t = result.timings
            entry.update(ok=True, frames_shape=list(result.video.frames.shape),
                         server_inference_s=t.get("server_inference"),
                         overhead_s=None if t.get("server_inference") is None
                         else round(t["decoded"] - t["server_inference"], 3))
        except Exception as exc:   # out of memory under a cap, or a real failure: both are results
            entry.update(ok=False, error=f"{type(exc).__name__}: {exc}"[:1500])
        t1 = time.monotonic()
        entry["wall_s"] = round(t1 - t0, 3)
        peak = self.gpu.peak_mib(t0, t1)
        entry["nvml_peak_mib"] = peak
        entry["nvml_peak_gib"] = round(peak / 1024, 2) if isinstance(peak, int) else peak
        progress = sup.progress()
        entry["seconds_per_step"] = None if progress is None else progress.seconds_per_step
        text = self.log_text(sup)
        stages, mp4 = stage_timings(text)[stages_before:], mp4_encode_s(text)[mp4_before:]
        entry["server_stages"] = stages[-1] if stages else None
        entry["mp4_encode_s"] = mp4[-1] if mp4 else None
        entry["oom"] = (not entry["ok"]) and "out of memory" in (entry.get("error", "") + text[-20000:]).lower()
        print(json.dumps(entry, default=str)[:1500], flush=True)
        return entry

    @staticmethod
    def log_text(sup: Any) -> str:
        path = sup.log_path
        try:
            return Path(path).read_text(errors="replace") if path else ""
        except OSError:
            return ""

    def config(self, name: str, shapes: list[tuple[int, int, int]], caps: list) -> dict:
        from vllm_omni_launcher.server.config.local_config import LocalConfig
        from vllm_omni_launcher.server.launch.spec import LaunchSpec, MemoryConfig, RuntimeConfig

        offload, tiling = CONFIGS[name]
        spec = LaunchSpec(self.a.model, gpus=(0,), memory=MemoryConfig(offload=offload, vae_tiling=tiling),
                          runtime=RuntimeConfig(enforce_eager=True))
        spec.validate()
        env = dict(server_extra_env(), VOL_MEMCAP_FILE=str(self.cap_file))
        config = LocalConfig(server_command=tuple(server_command(self.a.server_cmd)),
                             data_dir=self.a.data_dir, extra_env=env, startup_timeout_s=600,
                             **({"gpu_lock_dir": self.a.gpu_lock_dir} if self.a.gpu_lock_dir else {}))
        entry: dict[str, Any] = {"config": name, "offload": offload, "vae_tiling": tiling, "flags": spec.flags(),
                                 "jobs": []}
        self.report["configs"].append(entry)
        self.set_cap(0)
        with ServerRun(entry, spec, config, gpu=self.gpu, logs=self.a.logs, log_name=name, save=self.save,
                       after_stop=lambda: self.set_cap(0)) as run:
            sup, client = run.start()
            plan = [(None, s) for s in shapes] + list(caps)
            for cap, shape in plan:
                need = self.a.job_guess_s * (shape[0] * shape[1] * shape[2]) / (1280 * 704 * 121) + 15
                if not self.deadline.fits(need + 10):
                    entry["jobs"].append({"shape": list(shape), "cap_gib": cap, "skipped": "device call time"})
                    continue
                if cap is not None:
                    self.set_cap(cap)
                entry["jobs"].append(self.job(sup, client, spec, shape, cap))
                self.save()
                if run.died():
                    break
        return entry

    def main(self) -> int:
        shapes = parse_shapes(self.a.shapes)
        caps = parse_caps(self.a.caps) if self.a.caps else {}
        for name in self.a.configs.split(","):
            if not self.deadline.fits(self.a.config_min_s):
                self.report["configs"].append({"config": name, "skipped": "device call time"})
                continue
            self.config(name, shapes, caps.get(name, []))
        self.gpu.close()
        self.save()
        return 0


def add_parser(sub: Any) -> None:
    p = sub.add_parser("calibrate", help="memory + speed per config and shape (issue 25), caps")
    p.add_argument("--model", required=True, help="the full-size Diffusers folder")
    p.add_argument("--out", required=True)
    p.add_argument("--configs", default=",".join(CONFIGS))
    p.add_argument("--shapes", default=SHAPES)
    p.add_argument("--held-back", default=HELD_BACK, help="shapes not used for fitting (validation)")
    p.add_argument("--caps", default=CAPS, help="'config:GiB@WxHxF,...;config:...' ('' for none)")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--server-cmd", help="server command (default: vllm's CLI in this python)")
    p.add_argument("--data-dir", default="/tmp/vllm-omni-launcher-calibrate")
    p.add_argument("--logs", help="copy each configuration's server log here")
    p.add_argument("--gpu-lock-dir", help="the launcher's GPU lock folder (a rehearsal beside other tests)")
    p.add_argument("--cpu", action="store_true", help="rehearsal (stub server): no NVML")
    p.add_argument("--job-guess-s", type=float, default=25.0, help="a 1280x704x121 job's seconds, for skipping")
    p.add_argument("--config-min-s", type=float, default=100.0, help="skip a configuration with less time left")
    p.add_argument("--deadline-s", type=float, default=560.0)
    p.set_defaults(fn=lambda a: Calibration(a).main())
