"""Real-GPU check of the fused startup LoRA pair (vLLM-Omni 0.30), through OUR planner, Supervisor and client.

The tiny random-weight T2V-A14B of the GPU kit is served three times, one server per setting, with the
same request and seed: without LoRA (two jobs: a difference between them would make every other
difference meaningless), with a single-file LoRA per expert fused at start at strength 1.0, and the
same pair at strength 2.5. The flags come from server/launch/loras.py (`plan_loras`):
`--lora-backend distill --lora-path HIGH LOW`, the 2.5 pair being the scaled copies the launcher writes
in its data dir. The LoRA files are ComfyUI-format single files made by bench/make_tiny_lora.py (the
format the contract test lora_loader_check.py proves upstream's distill loader fuses key for key),
written into --data-dir unless --lora-dir holds `high.safetensors` and `low.safetensors`.

The JSON report is rewritten after every server, so a run cut short (SIGINT: that server is stopped,
no other starts) keeps what ran:
`started_with_flags`, `scaled_copies_fused` (x2.5 served from the launcher's copies), `fused_in_log`
(upstream's loader logged keys fused into both transformers; its "Missing loading lora key" warnings
are kept too), `deterministic`, `lora_changes_frames` (x1.0 and x2.5 each against no LoRA),
`strength_changes_frames` (x2.5 against x1.0), `ok`. On the stub server (`--server-cmd`, the CPU
rehearsal) no weights are loaded and the frames depend on the seed only, so only the planned flags,
the start, the scaled copies and the jobs are proven there.

usage: python bench/lora_fused_check.py --models DIR --out report.json [--lora-dir DIR] [--gpu 0]
       [--data-dir DIR] [--server-cmd CMD]
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path
from typing import Any, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu.common import import_package as _import_package, server_command, server_extra_env  # noqa: E402
from lora_gpu_check import DIFFERENT, LOG_MARKERS, mean_abs_diff, start_client  # noqa: E402

MODEL = "tiny-wan22-t2v-a14b"
REQUEST = dict(width=64, height=64, frames=17, fps=8.0, steps=4, seed=42)
PROMPT = "a red fox running through snow"
FUSED_LINE = re.compile(r"\d+ lora keys loaded into \w+|Missing loading lora key: \S+")
SETTINGS = (("none", None), ("x1.0", 1.0), ("x2.5", 2.5))


def lora_pair(model_dir: Path, lora_dir: Optional[Path], data_dir: Path) -> tuple[Path, Path]:
    """(high-noise, low-noise) LoRA files: the ready ones in `lora_dir`, else made for each expert's shapes."""
    if lora_dir is not None:
        return lora_dir / "high.safetensors", lora_dir / "low.safetensors"
    from make_tiny_lora import make_comfy_lora

    out = data_dir / "made-loras"
    return (make_comfy_lora(model_dir, out / "high.safetensors", expert="transformer", seed=1),
            make_comfy_lora(model_dir, out / "low.safetensors", expert="transformer_2", seed=2))


def serve_once(model_dir: Path, strength: Optional[float], pair: tuple[Path, Path], jobs: int,
               server_cmd: list[str], extra_env: dict[str, str], data_dir: Path, gpu: int) -> dict[str, Any]:
    """One server (fused pair at `strength`, or none), `jobs` identical jobs, stopped; its entry of the report
    with the decoded frames under "_frames" (never written out)."""
    from vllm_omni_launcher.models import family_for, request_for
    from vllm_omni_launcher.server.config.local_config import LocalConfig
    from vllm_omni_launcher.server.launch.loras import STARTUP_SINCE, LoraEntry, plan_loras
    from vllm_omni_launcher.server.launch.spec import LaunchSpec, ParallelConfig, RuntimeConfig
    from vllm_omni_launcher.server.supervision.supervisor import Supervisor

    family = family_for(str(model_dir))
    entry: dict[str, Any] = {"strength": strength, "jobs": []}
    startup = None
    if strength is not None:
        entries = [LoraEntry(str(pair[0]), strength, "high_noise"), LoraEntry(str(pair[1]), strength, "low_noise")]
        plan = plan_loras(entries, family, STARTUP_SINCE, data_dir=str(data_dir))
        startup, entry["plan_notes"] = plan.startup, list(plan.notes)
    spec = LaunchSpec(str(model_dir), gpus=(gpu,), parallel=ParallelConfig("none", 1),
                      runtime=RuntimeConfig(enforce_eager=True), **({"lora": startup} if startup else {}))
    spec.validate(version=STARTUP_SINCE)
    entry["flags"] = spec.flags()
    if startup is not None:
        entry["lora_paths"] = list(startup.lora_paths)
        entry["scaled_copies"] = [p for p in startup.lora_paths if Path(p).parent == data_dir / "loras"]
    config = LocalConfig(server_command=tuple(server_cmd), data_dir=str(data_dir), extra_env=extra_env,
                         startup_timeout_s=600)
    request = request_for(family, prompt=PROMPT, **REQUEST)
    frames: list[Any] = []
    sup = Supervisor(spec, config)
    try:
        client = start_client(sup, spec, entry)
        entry["launch_line_has_lora_paths"] = _launch_line_has(sup.tail(4000), entry.get("lora_paths"))
        for _ in range(jobs):
            t_job = time.monotonic()
            result = client.generate(request)
            entry["jobs"].append({"job_s": round(time.monotonic() - t_job, 3),
                                  "frames_shape": list(result.video.frames.shape)})
            frames.append(result.video.frames)
    except Exception as exc:  # the report says what failed, with the server's words
        entry["error"] = f"{type(exc).__name__}: {exc}"[:2000]
    except KeyboardInterrupt:   # the step's time limit: this server is stopped below and no other starts
        entry["error"] = entry["interrupted"] = f"SIGINT after {len(frames)} of {jobs} jobs"
    finally:
        tail = sup.tail(400)
        entry["log_lora_lines"] = [line for line in tail if any(m in line for m in LOG_MARKERS)][-12:]
        if "error" in entry:
            entry["log_tail"] = tail[-60:]
        sup.stop()
        entry["log_path"] = sup.log_path
        entry["fused_lines"] = fused_lines(sup.log_path)
        entry["_frames"] = frames
    return entry


def fused_lines(log_path: Optional[str]) -> list[str]:
    """The loader's own lines for each transformer it fused into (`N lora keys loaded into
    WanTransformer3DModel.`, diffusion/lora/loader.py), from the whole server log: logged at load, so
    before the tail."""
    try:
        text = Path(log_path).read_text(errors="replace") if log_path else ""
    except OSError:
        return []
    found = [m.group(0) for m in map(FUSED_LINE.search, text.splitlines()) if m]
    return [line for line in found if "loaded into" in line] + [line for line in found if "Missing" in line][:6]


def _launch_line_has(log_lines: list[str], paths: Optional[list[str]]) -> Optional[bool]:
    """Whether the Supervisor's launch line in the server log (the argv it ran; upstream's own "non-default
    args" echo leaves the LoRA flags out) names every fused file after --lora-path (None: no LoRA)."""
    if not paths:
        return None
    launch = [line for line in log_lines if "--lora-path" in line]
    return bool(launch) and all(f"--lora-path {' '.join(paths)}" in line for line in launch)


def _has_run(flags: list[str], run: list[str]) -> bool:
    """Whether `run` appears in `flags` as consecutive items."""
    return any(flags[i:i + len(run)] == run for i in range(len(flags) - len(run) + 1))


def verdict(report: dict[str, Any], frames: dict[str, list[Any]]) -> None:
    """The differences and booleans of the report, from the frames of the settings that ran."""
    first = lambda name: (frames.get(name) or [None])[0]   # noqa: E731
    none = frames.get("none") or []
    diff = {"none_vs_none_again": mean_abs_diff(*(none + [None, None])[:2]),
            "none_vs_x1.0": mean_abs_diff(first("none"), first("x1.0")),
            "none_vs_x2.5": mean_abs_diff(first("none"), first("x2.5")),
            "x1.0_vs_x2.5": mean_abs_diff(first("x1.0"), first("x2.5"))}
    report["diff"] = diff
    servers = report["servers"]
    fused = [s for s in servers.values() if s.get("strength") is not None]
    report["started_with_flags"] = bool(fused) and all("ready_s" in s and s.get("launch_line_has_lora_paths") and _has_run(
        s["flags"], ["--lora-backend", "distill", "--lora-path", *s["lora_paths"]]) for s in fused)
    scaled = [s for s in fused if s["strength"] != 1.0]
    report["scaled_copies_fused"] = bool(scaled) and all(len(s.get("scaled_copies", [])) == 2 for s in scaled)
    report["fused_in_log"] = bool(fused) and all(
        sum("loaded into" in line for line in s.get("fused_lines", [])) >= 2 for s in fused)
    report["deterministic"] = diff["none_vs_none_again"] is not None and diff["none_vs_none_again"] < DIFFERENT
    report["lora_changes_frames"] = {k: diff[f"none_vs_{k}"] is not None and diff[f"none_vs_{k}"] >= DIFFERENT
                                     for k in ("x1.0", "x2.5")}
    report["strength_changes_frames"] = diff["x1.0_vs_x2.5"] is not None and diff["x1.0_vs_x2.5"] >= DIFFERENT
    report["ok"] = bool(len(servers) == len(SETTINGS) and not any("error" in s for s in servers.values())
                        and report["started_with_flags"] and report["scaled_copies_fused"] and report["deterministic"]
                        and all(report["lora_changes_frames"].values()) and report["strength_changes_frames"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", required=True, help=f"folder holding {MODEL}")
    parser.add_argument("--out", required=True, help="JSON report path (rewritten after every server)")
    parser.add_argument("--lora-dir", default=None, help="folder with high.safetensors and low.safetensors "
                        "(default: made by bench/make_tiny_lora.py in --data-dir; needs torch)")
    parser.add_argument("--gpu", type=int, default=0)
    parser.add_argument("--server-cmd", default=None, help="server command (default: vllm's CLI main in this python)")
    parser.add_argument("--data-dir", default="/tmp/vllm-omni-launcher-lora-fused")
    args = parser.parse_args()

    _import_package()
    from vllm_omni_launcher.server.launch import versions

    model_dir, data_dir, out = Path(args.models) / MODEL, Path(args.data_dir), Path(args.out)
    data_dir.mkdir(parents=True, exist_ok=True)
    pair = lora_pair(model_dir, Path(args.lora_dir) if args.lora_dir else None, data_dir)
    server_cmd, extra_env = server_command(args.server_cmd), server_extra_env()
    found = versions.detect(server_cmd, extra_env=extra_env)
    report: dict[str, Any] = {
        "check": "lora_fused", "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": " ".join(sys.argv), "model": str(model_dir), "request": REQUEST,
        "lora_files": [str(p) for p in pair],
        "server_versions": None if found is None else {"python": found.python, "vllm": found.vllm,
                                                       "vllm_omni": found.vllm_omni},
        "stub": args.server_cmd is not None and "stub_vllm_serve" in args.server_cmd,
        "servers": {}}
    frames: dict[str, list[Any]] = {}

    def save() -> None:
        verdict(report, frames)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=1, default=str))

    for name, strength in SETTINGS:
        entry = serve_once(model_dir, strength, pair, 2 if strength is None else 1, server_cmd, extra_env,
                           data_dir, args.gpu)
        frames[name] = entry.pop("_frames")
        report["servers"][name] = entry
        save()
        print(f"{name}: ready {entry.get('ready_s')} s, jobs {entry['jobs']}, error {entry.get('error')}",
              file=sys.stderr, flush=True)
        if "interrupted" in entry:
            report["interrupted"] = f"SIGINT during server {len(report['servers'])} of {len(SETTINGS)} ({name})"
            break
    save()
    print(json.dumps({k: v for k, v in report.items() if k != "servers"}, indent=1, default=str))
    print(f"ok={report['ok']} -> {out}")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
