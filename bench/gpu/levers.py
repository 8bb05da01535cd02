"""Issue 26 section 3: every speed lever of our server, one server per lever, through our Supervisor and client.

Each configuration is one LaunchSpec (the same spec the Serving Config node and the CLI build) plus, for what
no setting owns yet, allow-listed extra flags (`--diffusion-attention-backend`, `--cache-config`). Per server:
launch-to-ready seconds; per job: the server's own stage seconds (vllm-omni's DEBUG_PERF line: text encode,
denoise, VAE decode), its postprocess and MP4 encode, s/step from our log parser, the client's timings
(submit, detection, download, decode: our overhead beside the server's `inference_time_s`), the NVML peak of
the whole GPU, and the PSNR of the decoded frames against the `eager` configuration's frames of the same
request (same seed, prompt, steps): a numeric drift signal only, the weights are random.

`--cli-jobs N` runs N jobs more on the first configuration through the CLI's own `generate` code path
(cli/generate_cmd.py `_generate`: the MP4 written, no frames decoded, the supervisor's fast-poll hint) for
issue 25's overhead figure. The report is rewritten after every job (a call cut at its limit keeps it).
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from .common import (Deadline, Gpu, ServerRun, import_package, last_step_rate, machine, mp4_encode_s,
                     postprocess_s, psnr, save_json, server_command, server_extra_env, stage_timings)

PROMPT = "A red fox trotting through fresh snow in a birch forest at sunrise, soft golden light, cinematic"
NEGATIVE = "blurry, low quality, distorted, jitter, flicker, watermark, text"
# name -> what differs from the plain eager server (a spec field or extra flags) or its requests ("preencode": the
# request's worker-side MP4, VideoRequest.preencode; every other configuration's requests set it False, so each
# measures the plain path, whatever the launcher's own jobs get). `preencode`: vLLM-Omni 0.30's worker-side MP4 (Wan
# pipelines, `extra_params.preencode_mp4`, pipeline_wan2_2.py:725-726, 981-988): the VAE decodes in chunks of 17
# frames straight into the MP4 encoder, so the host copy and the encode overlap the decode and the serving layer's
# postprocess and one-shot encode are skipped: 1.8-2.0 s less per TI2V-5B 1280x704x121 job on an H200
# (bench/results/h200-issue25-overhead-and-preencode-vllm-omni-0.30/). The launcher's own jobs get it where
# server/launch/worker_mp4.py allows.
CONFIGS: dict[str, dict[str, Any]] = {
    "eager": {},
    "preencode": {"preencode": True},
    "compile": {"compile": True},
    "cache_dit": {"cache_backend": "cache_dit"},
    "cache_dit_scm_fast": {"cache_backend": "cache_dit",
                           "extra": ("--cache-config", json.dumps({"scm_steps_mask_policy": "fast"}))},
    "cache_dit_scm_medium": {"cache_backend": "cache_dit",
                             "extra": ("--cache-config", json.dumps({"scm_steps_mask_policy": "medium"}))},
    "fp8": {"fp8": True},
    "attn_cudnn": {"extra": ("--diffusion-attention-backend", "CUDNN_ATTN")},
    "attn_sdpa": {"extra": ("--diffusion-attention-backend", "TORCH_SDPA")},
    "attn_flashinfer": {"extra": ("--diffusion-attention-backend", "FLASHINFER_ATTN")},
    "fp8_cache_dit": {"fp8": True, "cache_backend": "cache_dit"},
    "compile_fp8_cache_dit": {"compile": True, "fp8": True, "cache_backend": "cache_dit"},
}


def parse_jobs(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


class Levers:
    def __init__(self, a: argparse.Namespace) -> None:
        self.a = a
        self.deadline = Deadline(a.deadline_s)
        self.out = Path(a.out)
        import_package()
        self.gpu = Gpu(not a.cpu)
        self.reference: dict[int, Any] = {}          # steps -> the eager configuration's frames
        self.report: dict[str, Any] = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                                       "machine": machine(), "args": vars(a), "configs": []}
        if a.reference and Path(a.reference).is_file():
            self.load_reference(Path(a.reference))

    def save(self) -> None:
        self.report["elapsed_s"] = round(self.a.deadline_s - self.deadline.left(), 1)
        save_json(self.out / "levers.json", self.report)

    def load_reference(self, path: Path) -> None:
        import numpy as np

        with np.load(path) as z:
            self.reference = {int(k.removeprefix("steps")): z[k] for k in z.files}

    def keep_reference(self, steps: int, frames: Any) -> None:
        import numpy as np

        self.reference[steps] = frames
        if self.a.reference:      # a later call (a fresh process) compares against the same frames
            Path(self.a.reference).parent.mkdir(parents=True, exist_ok=True)
            np.savez(self.a.reference, **{f"steps{k}": v for k, v in self.reference.items()})

    def spec(self, name: str) -> Any:
        from vllm_omni_launcher.server.launch.spec import LaunchSpec, MemoryConfig, RuntimeConfig

        c = CONFIGS[name]
        spec = LaunchSpec(self.a.model, gpus=(0,),
                          memory=MemoryConfig(quantization="fp8" if c.get("fp8") else "none"),
                          runtime=RuntimeConfig(cache_backend=c.get("cache_backend", "none"),
                                                enforce_eager=not c.get("compile", False)),
                          extra_flags=tuple(c.get("extra", ())))
        spec.validate()
        return spec

    def request(self, steps: int, name: str = "eager") -> Any:
        from vllm_omni_launcher.client.api import VideoRequest

        return VideoRequest(prompt=PROMPT, negative_prompt=NEGATIVE, width=self.a.width, height=self.a.height,
                            num_frames=self.a.frames, fps=24.0, steps=steps, guidance=5.0, flow_shift=8.0,
                            seed=self.a.seed, preencode=bool(CONFIGS[name].get("preencode", False)))

    @staticmethod
    def log_text(sup: Any) -> str:
        try:
            return Path(sup.log_path).read_text(errors="replace") if sup.log_path else ""
        except OSError:
            return ""

    def server_parts(self, sup: Any, before: str) -> dict[str, Any]:
        """The server's own seconds for the newest job: stages, postprocess, MP4 encode, s/step."""
        text = self.log_text(sup)
        new = text[len(before):]
        stages, post, mp4 = stage_timings(new), postprocess_s(new), mp4_encode_s(new)
        return {"server_stages": stages[-1] if stages else None, "postprocess_s": post[-1] if post else None,
                "mp4_encode_s": mp4[-1] if mp4 else None, "tqdm_s_per_step": last_step_rate(new)}

    def job(self, name: str, sup: Any, client: Any, steps: int, via: str) -> dict:
        entry: dict[str, Any] = {"config": name, "steps": steps, "via": via}
        before = self.log_text(sup)
        t0 = time.monotonic()
        try:
            if via == "cli":
                entry.update(self.cli_job(sup, client, steps, name))
            else:
                result = client.generate(self.request(steps, name), due=self.due(sup))
                t = result.timings
                entry.update(ok=True, mp4_bytes=len(result.mp4), timings={k: round(v, 4) for k, v in t.items()})
                frames = result.video.frames
                entry["frames_shape"] = list(frames.shape)
                if name == "eager" and steps not in self.reference:
                    self.keep_reference(steps, frames)
                    entry["psnr_db_vs_eager"] = "reference"
                else:
                    entry["psnr_db_vs_eager"] = psnr(frames, self.reference.get(steps))
                del result, frames
        except Exception as exc:    # a lever that fails is a result too
            entry.update(ok=False, error=f"{type(exc).__name__}: {exc}"[:2000])
        t1 = time.monotonic()
        entry["wall_s"] = round(t1 - t0, 3)
        entry["nvml_peak_mib"] = self.gpu.peak_mib(t0, t1)
        progress = sup.progress()
        entry["parser_s_per_step"] = None if progress is None else progress.seconds_per_step
        entry.update(self.server_parts(sup, before))
        t = entry.get("timings") or {}
        if t.get("server_inference") is not None:
            entry["ours_s"] = round(t["decoded"] - t["server_inference"], 3)   # beyond the server's task time
        print("JOB " + json.dumps(entry, default=str)[:1800], flush=True)
        return entry

    @staticmethod
    def due(sup: Any) -> Any:
        """The supervisor's fast-poll hint, as the node and the CLI give it (cli/generate_cmd.py)."""
        from vllm_omni_launcher.cli.generate_cmd import _denoised

        return _denoised(sup)

    def cli_job(self, sup: Any, client: Any, steps: int, name: str = "eager") -> dict:
        """One job through the CLI's `generate` path (MP4 written, header checked, no frame decode)."""
        from vllm_omni_launcher.cli.generate_cmd import _generate

        work = Path(self.a.data_dir) / "cli"
        work.mkdir(parents=True, exist_ok=True)
        args = SimpleNamespace(out=str(work / "clip.mp4"), frames_npy=None, report_json=str(work / "report.json"))
        rc = _generate(args, client, self.request(steps, name), sup)
        rep = json.loads((work / "report.json").read_text())
        return {"ok": rc == 0, "mp4_bytes": rep.get("mp4_bytes"),
                "timings": {k: round(v, 4) for k, v in rep["timings"].items() if isinstance(v, (int, float))}}

    def config(self, name: str, jobs: list[int], cli_jobs: int) -> None:
        from vllm_omni_launcher.server.config.local_config import LocalConfig

        entry: dict[str, Any] = {"config": name, "jobs": []}
        self.report["configs"].append(entry)
        try:
            spec = self.spec(name)
        except Exception as exc:
            entry["error"] = f"{type(exc).__name__}: {exc}"[:2000]
            self.save()
            return
        entry["flags"] = spec.flags()
        config = LocalConfig(server_command=tuple(server_command(self.a.server_cmd)),
                             data_dir=self.a.data_dir, extra_env=server_extra_env(),
                             startup_timeout_s=self.a.startup_timeout_s,
                             **({"gpu_lock_dir": self.a.gpu_lock_dir} if self.a.gpu_lock_dir else {}))
        with ServerRun(entry, spec, config, gpu=self.gpu, logs=self.a.logs, log_name=name, save=self.save) as run:
            sup, client = run.start()
            plan = [(s, "client") for s in jobs] + [(jobs[-1] if self.a.cli_steps is None else self.a.cli_steps,
                                                     "cli")] * cli_jobs
            for steps, via in plan:
                need = 12 + steps * self.a.step_guess_s
                if not self.deadline.fits(need + 10):
                    entry["jobs"].append({"steps": steps, "via": via, "skipped": "device call time"})
                    continue
                entry["jobs"].append(self.job(name, sup, client, steps, via))
                self.save()
                if run.died():
                    break

    def main(self) -> int:
        for i, item in enumerate(self.a.configs.split(",")):
            name, _, own = item.partition(":")           # name or name:steps+steps (this config's own jobs)
            jobs = parse_jobs(own.replace("+", ",") if own else self.a.jobs)
            ready_guess = self.a.compile_ready_guess_s if CONFIGS[name].get("compile") else self.a.ready_guess_s
            need = ready_guess + 12 + jobs[0] * self.a.step_guess_s
            if not self.deadline.fits(need):
                self.report["configs"].append({"config": name, "skipped": f"{self.deadline.left():.0f}s left, "
                                                                          f"needs ~{need:.0f}s"})
                self.save()
                continue
            self.config(name, jobs, self.a.cli_jobs if i == 0 else 0)
        self.gpu.close()
        self.save()
        return 0


def add_parser(sub: Any) -> None:
    p = sub.add_parser("levers", help="our server's speed levers, one server each (issue 26 s3)")
    p.add_argument("--model", required=True, help="the full-size Diffusers folder")
    p.add_argument("--out", required=True)
    p.add_argument("--configs", default="eager,cache_dit,fp8,compile",
                   help=f"of {', '.join(CONFIGS)}; NAME:4+20 gives one configuration its own jobs")
    p.add_argument("--jobs", default="20", help="steps of each job per configuration, e.g. 20 or 20,40")
    p.add_argument("--cli-jobs", type=int, default=0, help="jobs through the CLI's generate path (first config)")
    p.add_argument("--cli-steps", type=int, default=None)
    p.add_argument("--reference", help="npz of the eager frames (written when eager runs, read by later calls)")
    p.add_argument("--width", type=int, default=1280)
    p.add_argument("--height", type=int, default=704)
    p.add_argument("--frames", type=int, default=121)
    p.add_argument("--seed", type=int, default=44)
    p.add_argument("--server-cmd", help="server command (default: vllm's CLI in this python)")
    p.add_argument("--data-dir", default="/tmp/vllm-omni-launcher-levers")
    p.add_argument("--logs", help="copy each configuration's server log here")
    p.add_argument("--gpu-lock-dir")
    p.add_argument("--cpu", action="store_true", help="rehearsal (stub server): no NVML")
    p.add_argument("--startup-timeout-s", type=float, default=420.0)
    p.add_argument("--ready-guess-s", type=float, default=40.0)
    p.add_argument("--compile-ready-guess-s", type=float, default=130.0)
    p.add_argument("--step-guess-s", type=float, default=1.9)
    p.add_argument("--deadline-s", type=float, default=560.0)
    p.set_defaults(fn=lambda a: Levers(a).main())
