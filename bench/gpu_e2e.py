"""Real-GPU end-to-end check: OUR supervisor launches the real vLLM-Omni server, OUR client
generates a clip and decodes it to the IMAGE array, and Stop leaves the GPUs empty.

Runs three configurations on the tiny random-weight Wan2.2 models of the GPU kit:
TI2V on 1 GPU, TI2V with Ulysses 2, T2V-A14B with CFG parallel 2. Writes a JSON report
(versions, ready time, job time, our overhead, GPU memory per GPU). See bench/gpu_e2e.sh
for how it is run on the H200 machine; `--server-cmd` pointing at the stub server lets
the same driver run on a CPU box (that is how it is checked before GPU time is spent).

usage: python bench/gpu_e2e.py --models DIR --out report.json [--server-cmd CMD] [--only NAME]

`--fullsize DIR` instead runs the planner calibration and overhead set of issue 14 on the
full-size random-weight TI2V-5B folder (one GPU, `--enforce-eager`, VAE tiling on so decode does
not mask the denoise): per memory configuration one server (tiling only, layerwise offload, module
offload), several shapes per server. Per job: ready time, s/step (parsed from the server log),
the server's inference_time_s, our overhead (client wall minus it; download, decode), the
NVML peak sampled every 0.2 s against the planner's predicted peak. `--deadline-s` leaves out
what would not fit in the device call.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

from gpu.common import (PKG, Gpu, gpu_memory_mib, gpu_processes, import_package as _import_package,  # noqa: E402,F401
                        server_command, server_extra_env)   # the scripts' names for the shared helpers

CONFIGS = [
    # name, model folder, gpus, parallel mode, degree
    ("ti2v_1gpu", "tiny-wan22-ti2v", (0,), "none", 1),
    ("ti2v_ulysses2", "tiny-wan22-ti2v", (0, 1), "ulysses", 2),
    ("t2v_a14b_cfg2", "tiny-wan22-t2v-a14b", (0, 1), "cfg", 2),
]
REQUEST = dict(width=64, height=64, num_frames=17, fps=8.0, steps=4, seed=42)


def run_config(pkg: Any, name: str, model_dir: Path, gpus: tuple[int, ...], mode: str, degree: int,
               server_cmd: list[str], extra_env: dict[str, str], data_dir: Path) -> dict[str, Any]:
    from vllm_omni_launcher.client.api import VideoClient, VideoRequest
    from vllm_omni_launcher.server.config.local_config import LocalConfig
    from vllm_omni_launcher.server.launch.spec import LaunchSpec, ParallelConfig, RuntimeConfig
    from vllm_omni_launcher.server.supervision.supervisor import Supervisor

    spec = LaunchSpec(str(model_dir), gpus=gpus, parallel=ParallelConfig(mode, degree),
                      runtime=RuntimeConfig(enforce_eager=True))
    spec.validate()
    config = LocalConfig(server_command=tuple(server_cmd), data_dir=str(data_dir), extra_env=extra_env,
                         startup_timeout_s=600)
    phases: list[str] = []

    def on_status(status: Any) -> None:
        if not phases or phases[-1] != status.phase:
            phases.append(status.phase)

    report: dict[str, Any] = {"name": name, "flags": spec.flags(), "gpus": list(gpus), "ok": False}
    sup = Supervisor(spec, config)
    t0 = time.monotonic()
    try:
        sup.start(on_status=on_status)
        report["ready_s"] = round(time.monotonic() - t0, 2)
        report["phases"] = phases
        report["server_version"] = ".".join(map(str, sup.server_version))
        client = VideoClient(sup.url, api_key=sup.api_key, served_name=spec.served_name,
                             server_version=sup.server_version)
        steps_seen: list[tuple[int, int]] = []

        def on_update(update: Any) -> None:
            progress = sup.progress()
            if progress is not None and (not steps_seen or steps_seen[-1] != (progress.step, progress.total)):
                steps_seen.append((progress.step, progress.total))

        t_job = time.monotonic()
        result = client.generate(VideoRequest(prompt="a red fox running through snow", **REQUEST),
                                 on_update=on_update)
        report["job_s"] = round(time.monotonic() - t_job, 3)
        frames = result.video.frames
        report["frames_shape"] = list(frames.shape)
        report["fps"] = result.video.fps
        report["frames_dtype"] = str(frames.dtype)
        report["value_range"] = [round(float(frames.min()), 4), round(float(frames.max()), 4)]
        report["timings"] = {k: round(v, 4) for k, v in result.timings.items()}
        report["overhead_s"] = {
            "detect_after_server_done": result.timings.get("detect_delay"),
            "download": round(result.timings["downloaded"] - result.timings["job_done"], 4),
            "decode": round(result.timings["decoded"] - result.timings["downloaded"], 4),
        }
        last = sup.progress()
        report["progress_last"] = None if last is None else {"step": last.step, "total": last.total,
                                                              "seconds_per_step": last.seconds_per_step}
        report["progress_steps_seen"] = steps_seen
        report["gpu_memory_mib_after_job"] = gpu_memory_mib()
        checks = {
            "frames": frames.shape == (REQUEST["num_frames"], REQUEST["height"], REQUEST["width"], 3),
            "float32_0_1": str(frames.dtype) == "float32" and 0.0 <= frames.min() and frames.max() <= 1.0,
            "fps": abs(result.video.fps - REQUEST["fps"]) < 1e-3,
            "progress_parsed": last is not None and last.total == REQUEST["steps"] and last.step == last.total,
            "phases_in_order": phases[-1] == "ready" and "loading" in phases,
        }
        report["checks"] = {k: bool(v) for k, v in checks.items()}
    except Exception as exc:  # the report must say what failed, with the server's own words
        report["error"] = f"{type(exc).__name__}: {exc}"
        report["log_tail"] = sup.tail(60)
    finally:
        t_stop = time.monotonic()
        sup.stop()
        report["stop_s"] = round(time.monotonic() - t_stop, 2)
        time.sleep(2.0)   # let the driver release the memory the processes held
        report["gpu_memory_mib_after_stop"] = gpu_memory_mib()
        report["gpu_processes_after_stop"] = gpu_processes()
        report["process_group_left"] = sup.alive()
    empty = report["gpu_processes_after_stop"] in (None, []) and not report["process_group_left"]
    report.setdefault("checks", {})["gpus_empty_after_stop"] = empty
    report["ok"] = "error" not in report and all(report["checks"].values())
    return report


CALIBRATION_CONFIGS = [
    # name, offload, shapes (width, height, frames); 4 steps each
    ("tiling", "none", [(1280, 704, 121), (832, 480, 49), (1280, 704, 61)]),
    ("tiling_layerwise", "layerwise", [(1280, 704, 121), (832, 480, 49)]),
    ("tiling_module", "module", [(1280, 704, 121), (832, 480, 49)]),
]
CALIBRATION_STEPS = 4


def calibrate(model_dir: Path, server_cmd: list[str], extra_env: dict[str, str], data_dir: Path,
              deadline_s: float, shapes_override: Optional[list[tuple[int, int, int]]] = None,
              save: Callable[[list[dict[str, Any]]], None] = lambda results: None,
              only: Optional[set[str]] = None) -> list[dict[str, Any]]:
    """Issue 14's calibration set on one GPU (see the module docstring); one entry per server
    configuration. ``save`` gets the results so far after every job (a killed call keeps them)."""
    from vllm_omni_launcher.client.api import VideoClient, VideoRequest
    from vllm_omni_launcher.planner.memory import RequestShape, plan
    from vllm_omni_launcher.server.config.local_config import LocalConfig
    from vllm_omni_launcher.server.launch.spec import LaunchSpec, MemoryConfig, RuntimeConfig
    from vllm_omni_launcher.server.supervision.supervisor import Supervisor

    t_begin = time.monotonic()
    gpu = Gpu(True)
    results: list[dict[str, Any]] = []
    config = LocalConfig(server_command=tuple(server_cmd), data_dir=str(data_dir), extra_env=extra_env,
                         startup_timeout_s=600)
    for name, offload, shapes in CALIBRATION_CONFIGS:
        if only and name not in only:
            continue
        shapes = shapes_override or shapes
        if deadline_s - (time.monotonic() - t_begin) < 150:
            results.append({"config": name, "skipped": "device call time"})
            continue
        spec = LaunchSpec(str(model_dir), gpus=(0,), memory=MemoryConfig(offload=offload, vae_tiling=True),
                          runtime=RuntimeConfig(enforce_eager=True))
        sup = Supervisor(spec, config)
        t0 = time.monotonic()
        entry: dict[str, Any] = {"config": name, "flags": spec.flags(), "jobs": []}
        try:
            spec.validate()
            sup.start()
            entry["ready_s"] = round(time.monotonic() - t0, 2)
            entry["nvml_after_ready_mib"] = gpu.peak_mib(time.monotonic() - 1.0)
            client = VideoClient(sup.url, api_key=sup.api_key, served_name=spec.served_name,
                                 server_version=sup.server_version)
            for width, height, frames in shapes:
                if deadline_s - (time.monotonic() - t_begin) < 45:
                    entry["jobs"].append({"shape": [width, height, frames], "skipped": "device call time"})
                    continue
                predicted = plan(spec, RequestShape(width, height, frames), host_available_gib=None)
                t_job = time.monotonic()
                result = client.generate(VideoRequest(prompt="a red fox running through snow", width=width,
                                                      height=height, num_frames=frames, fps=24.0,
                                                      steps=CALIBRATION_STEPS, seed=7))
                wall = time.monotonic() - t_job
                t = result.timings
                progress = sup.progress()
                peak = gpu.peak_mib(t_job)
                server = t.get("server_inference")
                entry["jobs"].append({
                    "shape": [width, height, frames], "steps": CALIBRATION_STEPS,
                    "frames_shape": list(result.video.frames.shape), "client_wall_s": round(wall, 3),
                    "server_inference_s": server,
                    "overhead_s": None if server is None else round(t["decoded"] - server, 3),
                    "download_s": round(t["downloaded"] - t["job_done"], 4),
                    "decode_s": round(t["decoded"] - t["downloaded"], 4),
                    "detect_delay_s": t.get("detect_delay"),
                    "seconds_per_step": None if progress is None else progress.seconds_per_step,
                    "nvml_peak_mib": peak, "nvml_peak_gib": round(peak / 1024, 2) if isinstance(peak, int) else peak,
                    "planner_peak_gib": round(predicted.peak_gib, 2),
                    "planner_gpu": [g.to_dict() for g in predicted.gpus]})
                print(json.dumps(entry["jobs"][-1], default=str)[:1500], flush=True)
                save(results + [entry])
        except Exception as exc:   # the report says what failed, with the server's own words
            entry["error"] = f"{type(exc).__name__}: {exc}"[:3000]
            entry["log_tail"] = sup.tail(40)
        finally:
            sup.stop()
            entry["gpu_processes_after_stop"] = gpu_processes()
        results.append(entry)
    gpu.close()
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", help="folder holding tiny-wan22-ti2v and tiny-wan22-t2v-a14b")
    parser.add_argument("--fullsize", help="full-size TI2V-5B folder: run the calibration set instead")
    parser.add_argument("--deadline-s", type=float, default=480.0, help="--fullsize: time for the whole set")
    parser.add_argument("--shapes", help="--fullsize: WxHxF,... instead of the set's shapes (the CPU rehearsal)")
    parser.add_argument("--out", required=True)
    parser.add_argument("--server-cmd", default=None,
                        help="server command (default: this python running vllm's CLI main)")
    parser.add_argument("--data-dir", default="/tmp/vllm-omni-launcher-e2e")
    parser.add_argument("--only", action="append", default=[],
                        help="run only these configuration names (with --fullsize: tiling, tiling_layerwise, tiling_module)")
    args = parser.parse_args()

    pkg = _import_package()
    from vllm_omni_launcher.server.launch import versions

    server_cmd, extra_env = server_command(args.server_cmd), server_extra_env()
    found = versions.detect(server_cmd, extra_env=extra_env)
    report: dict[str, Any] = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": " ".join(sys.argv),
        "server_versions": None if found is None else {"python": found.python, "vllm": found.vllm,
                                                       "vllm_omni": found.vllm_omni},
        "gpu_memory_mib_before": gpu_memory_mib(),
        "request": REQUEST,
        "configs": [],
    }
    if args.fullsize:
        shapes = [tuple(int(v) for v in x.split("x")) for x in args.shapes.split(",")] if args.shapes else None
        def save(results: list[dict[str, Any]]) -> None:
            Path(args.out).write_text(json.dumps({**report, "calibration": results}, indent=1, default=str))

        report["request"] = {"steps": CALIBRATION_STEPS, "fps": 24.0, "shapes": "per configuration, see entries"}
        report["calibration"] = calibrate(Path(args.fullsize), server_cmd, extra_env, Path(args.data_dir),
                                          args.deadline_s, shapes, save, set(args.only) or None)
        jobs = [j for c in report["calibration"] for j in c.get("jobs", []) if "skipped" not in j]
        report["all_ok"] = bool(jobs) and not any("error" in c for c in report["calibration"])
        Path(args.out).write_text(json.dumps(report, indent=1, default=str))
        print(f"all_ok={report['all_ok']} ({len(jobs)} jobs) -> {args.out}")
        return 0 if report["all_ok"] else 1
    if not args.models:
        parser.error("--models or --fullsize is needed")
    for name, folder, gpus, mode, degree in CONFIGS:
        if args.only and name not in args.only:
            continue
        print(f"== {name}", flush=True)
        result = run_config(pkg, name, Path(args.models) / folder, gpus, mode, degree, server_cmd, extra_env,
                            Path(args.data_dir))
        print(json.dumps({k: v for k, v in result.items() if k != "log_tail"}, indent=1, default=str), flush=True)
        if "log_tail" in result:
            print("\n".join(result["log_tail"]), flush=True)
        report["configs"].append(result)
    report["all_ok"] = bool(report["configs"]) and all(c["ok"] for c in report["configs"])
    Path(args.out).write_text(json.dumps(report, indent=1, default=str))
    print(f"all_ok={report['all_ok']} -> {args.out}")
    return 0 if report["all_ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
