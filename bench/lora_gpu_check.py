"""Real-GPU check of per-request LoRA and the Euler sampler, through OUR supervisor and client.

One real vLLM-Omni server (tiny random-weight TI2V of the GPU kit, one GPU, eager) runs four
jobs with the same seed: no LoRA, no LoRA again (proves the frames are reproducible, so a
difference means something), with a PEFT LoRA made for that model by bench/make_tiny_lora.py
(sent as the per-request `lora` form field), and with `sampler="euler"` (sent as
extra_params.sample_solver). It prints and writes one JSON report:
`lora_changes_frames`, `deterministic`, `euler_ran`, `euler_changes_frames`, `ok`.

Works with vLLM-Omni 0.26 and 0.30 (per-request LoRA exists in both). Needs torch, peft and
diffusers in the python that runs it (to make the LoRA), unless --lora names a ready PEFT folder:
the device's 0.30 server venv has no peft, so there it gets bench/fixtures/tiny-wan22-ti2v-peft-lora
(made by `make_tiny_lora.py peft` for this model). `--server-cmd` pointing at the stub server lets the
same driver run on a CPU box, where the frames depend on the seed only: there only the jobs, the form
fields and the determinism are proven, not that the LoRA or the sampler change anything.

usage: python bench/lora_gpu_check.py --models DIR --out report.json [--lora PEFT_DIR] [--gpu 0]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu.common import gpu_memory_mib, import_package as _import_package, server_command, server_extra_env  # noqa: E402
from make_tiny_lora import make_peft_lora  # noqa: E402

MODEL = "tiny-wan22-ti2v"
REQUEST = dict(width=64, height=64, num_frames=17, fps=8.0, steps=4, seed=42)
PROMPT = "a red fox running through snow"
# Mean absolute difference (0..1 pixel scale) above which two decoded clips count as different;
# reproducible runs of one request decode to identical frames, random-weight LoRAs move them by ~0.1.
DIFFERENT = 1e-3
LOG_MARKERS = ("adapter", "LoRA", "lora")


def mean_abs_diff(a: Any, b: Any) -> Optional[float]:
    import numpy as np

    if a is None or b is None or a.shape != b.shape:
        return None
    return round(float(np.abs(a.astype(np.float32) - b.astype(np.float32)).mean()), 6)


def start_client(sup: Any, spec: Any, into: dict[str, Any]) -> Any:
    """Start the supervised server, note its ready time and version in `into`; a client for it."""
    from vllm_omni_launcher.client.api import VideoClient

    t0 = time.monotonic()
    sup.start()
    into["ready_s"] = round(time.monotonic() - t0, 2)
    into["server_version"] = ".".join(map(str, sup.server_version))
    return VideoClient(sup.url, api_key=sup.api_key, served_name=spec.served_name, server_version=sup.server_version)


def run_check(model_dir: Path, lora_dir: Path, server_cmd: list[str], extra_env: dict[str, str],
              data_dir: Path, gpu: int) -> dict[str, Any]:
    """Start one server, run the four jobs, stop it; the report (never raises for a job failure)."""
    from vllm_omni_launcher.client.request import RequestLora, VideoRequest
    from vllm_omni_launcher.server.config.local_config import LocalConfig
    from vllm_omni_launcher.server.launch.spec import LaunchSpec, ParallelConfig, RuntimeConfig
    from vllm_omni_launcher.server.supervision.supervisor import Supervisor

    spec = LaunchSpec(str(model_dir), gpus=(gpu,), parallel=ParallelConfig("none", 1),
                      runtime=RuntimeConfig(enforce_eager=True))
    spec.validate()
    config = LocalConfig(server_command=tuple(server_cmd), data_dir=str(data_dir), extra_env=extra_env,
                         startup_timeout_s=600)
    lora = RequestLora(name="tiny-peft", path=str(lora_dir.resolve()), scale=1.0)
    jobs = {
        "base": VideoRequest(prompt=PROMPT, **REQUEST),
        "base_again": VideoRequest(prompt=PROMPT, **REQUEST),
        "lora": VideoRequest(prompt=PROMPT, lora=lora, **REQUEST),
        "euler": VideoRequest(prompt=PROMPT, sampler="euler", **REQUEST),
    }
    report: dict[str, Any] = {"model": str(model_dir), "lora": str(lora_dir), "flags": spec.flags(),
                              "request": REQUEST, "jobs": {}}
    frames: dict[str, Any] = {}
    sup = Supervisor(spec, config)
    try:
        client = start_client(sup, spec, report)
        for name, req in jobs.items():
            entry: dict[str, Any] = {"form": {k: v for k, v in req.form_fields(sup.server_version).items()
                                              if k in ("lora", "extra_params", "seed")}}
            t_job = time.monotonic()
            try:
                result = client.generate(req)
                entry["job_s"] = round(time.monotonic() - t_job, 3)
                entry["frames_shape"] = list(result.video.frames.shape)
                frames[name] = result.video.frames
            except Exception as exc:  # the report says which job failed, with the server's words
                entry["error"] = f"{type(exc).__name__}: {exc}"
            report["jobs"][name] = entry
        report["gpu_memory_mib_after_jobs"] = gpu_memory_mib()
    except Exception as exc:
        report["error"] = f"{type(exc).__name__}: {exc}"
    except KeyboardInterrupt:   # the step's time limit: stop the server, report the jobs that ran
        report["error"] = f"interrupted (SIGINT) after {len(frames)} of {len(jobs)} jobs"
    finally:
        tail = sup.tail(400)
        report["log_lora_lines"] = [line for line in tail if any(m in line for m in LOG_MARKERS)][-20:]
        if "error" in report or any("error" in j for j in report["jobs"].values()):
            report["log_tail"] = tail[-60:]
        sup.stop()
    report["diff"] = {
        "base_vs_base_again": mean_abs_diff(frames.get("base"), frames.get("base_again")),
        "base_vs_lora": mean_abs_diff(frames.get("base"), frames.get("lora")),
        "base_vs_euler": mean_abs_diff(frames.get("base"), frames.get("euler")),
    }
    diff = report["diff"]
    report["deterministic"] = diff["base_vs_base_again"] is not None and diff["base_vs_base_again"] < DIFFERENT
    report["lora_changes_frames"] = diff["base_vs_lora"] is not None and diff["base_vs_lora"] >= DIFFERENT
    report["euler_ran"] = "euler" in frames and list(frames["euler"].shape) == [
        REQUEST["num_frames"], REQUEST["height"], REQUEST["width"], 3]
    report["euler_changes_frames"] = diff["base_vs_euler"] is not None and diff["base_vs_euler"] >= DIFFERENT
    report["ok"] = bool("error" not in report and report["deterministic"] and report["lora_changes_frames"]
                        and report["euler_ran"])
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", required=True, help=f"folder holding {MODEL}")
    parser.add_argument("--out", required=True, help="JSON report path")
    parser.add_argument("--lora", default=None, help="ready PEFT folder (default: make one in --data-dir)")
    parser.add_argument("--gpu", type=int, default=0)
    parser.add_argument("--server-cmd", default=None,
                        help="server command (default: this python running vllm's CLI main)")
    parser.add_argument("--data-dir", default="/tmp/vllm-omni-launcher-lora")
    args = parser.parse_args()

    _import_package()
    from vllm_omni_launcher.server.launch import versions

    model_dir = Path(args.models) / MODEL
    data_dir = Path(args.data_dir)
    lora_dir = Path(args.lora) if args.lora else make_peft_lora(model_dir, data_dir / "tiny-peft-lora")
    server_cmd, extra_env = server_command(args.server_cmd), server_extra_env()
    found = versions.detect(server_cmd, extra_env=extra_env)
    report = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": " ".join(sys.argv),
        "server_versions": None if found is None else {"python": found.python, "vllm": found.vllm,
                                                       "vllm_omni": found.vllm_omni},
        **run_check(model_dir, lora_dir, server_cmd, extra_env, data_dir, args.gpu),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1, default=str))
    print(json.dumps({k: v for k, v in report.items() if k != "log_tail"}, indent=1, default=str))
    if "log_tail" in report:
        print("\n".join(report["log_tail"]))
    print(f"ok={report['ok']} -> {args.out}")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
