"""Our overhead around the GPU, per job: client wall time minus the server's inference_time_s.

`inference_time_s` is the server's own task time (engine, VAE decode, MP4 encode, saving the
file); everything else a user waits for is ours or HTTP's: submit, noticing completion
(polling), the /content download and the MP4 -> IMAGE decode. Each job is run through our
VideoClient exactly as the Generate Video node runs it, and reported with that split. The decode
runs while the MP4 downloads (client/streamed_download.py): download_s is job done -> last byte,
decode_s what is left of the decode after it.

Levers measured in the same run (not assumed):
- poll modes: `fixed` (a poll every 0.25 s) against `due` (FAST_POLL_S polls once the
  supervisor's log shows the last denoise step; against a --url server: once the job has run
  90% of what the previous job of that shape took, the remote rule of nodes/progress.py);
  `due@0.02` is the due rule with another fast-poll interval (here 0.02 s, session 4's);
  `plain` is what the CLI with --url and a plain VideoClient.generate() get: no hint, the fast-poll
  window from what the earlier jobs of that shape took (client/poll_window.py); `fixed` forgets
  those times before each job;
- decode levers on each job's own MP4 bytes: decode_mp4 as shipped, with the per-frame scaler
  of before (PyAV's to_ndarray: a new SwsContext with a thread per core for every frame), its
  serial conversion (workers=0), PyAV decode alone, decode + rgb24, the float32 write alone,
  the PyAV thread modes; and whether the MP4's index (moov) comes before its data;
- download levers on the last measured job of each shape, kept on the server and fetched again
  from its /content (`download_levers`): the whole path MP4 -> IMAGE as shipped (decoded while it
  downloads, the index fetched first with a Range request, into a prepared output), the same
  with each decoder setting of SETTINGS changed (decoder threads x conversion workers, FRAME
  threading, the scaler of before: `setting_over_shipped` < 1 means that setting was faster on
  this machine, `best_setting` names the fastest), without the Range tail, the previous path
  (download, then decode), the download alone, and how long the decoder waited for bytes
  (`read_wait_s`; near 0: not download-bound, so parallel Range requests could not help);
- `--natural`: the same client path on a clip of smooth moving content of each shape, encoded
  with upstream's encoder settings (natural_clip), served as /content is (no GPU): what a real
  clip costs next to a random-weight model's noise.

On the stub (CPU) the MP4s are a few KB (its frames are flat blocks), so the download levers mean
something only against a real server's clips, or with bench/decode_bench.py --noise --stream
(random-weight-like clips served as upstream serves them).

Servers (the first two are launched and stopped by our Supervisor, as Local Server does):
    python bench/overhead_bench.py                                   # CPU: the stub server
    python bench/overhead_bench.py --model DIR [--gpus 0] [--server-cmd CMD]     # the real server
    python bench/overhead_bench.py --url http://127.0.0.1:8091 [--api-key-env VAR]
Common: --shapes 832x480x49,1280x704x121 --steps 4 --repeat 3 --poll-modes fixed,due
--lever-repeat 3 (0: no levers) --natural [--serve-python PY].
Interrupted (SIGINT, gpu_session.sh's time limit), it still prints what it measured ("interrupted").
The stub needs VLLM_OMNI_LAUNCHER_TEST_SERVER_PYTHON (the server venv's python).

JSON on stdout (one object: per-job rows, per shape and mode medians, levers); progress on stderr.

Modules: overhead_jobs.py (the server and one job with its split), decode_levers.py (decode and download
levers, serving a clip as /content), natural_clip.py (--natural); this file runs them and prints the report.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import sys
import time
from pathlib import Path
from typing import Any, Optional

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from decode_levers import download_levers, levers, median  # noqa: E402
from gpu.common import import_package  # noqa: E402  (the bench's shared helpers)
from natural_clip import natural_levers  # noqa: E402
from overhead_jobs import parse_shapes, remote, run_job, say, supervised  # noqa: E402

STUB_MODEL = "Wan-AI/Wan2.2-TI2V-5B-Diffusers"
DEFAULT_SHAPES = "832x480x49,1280x704x121"
VLLM_MAIN = ("import sys; from vllm.entrypoints.cli.main import main; "
             "sys.argv[0] = 'vllm'; sys.exit(main())")
PASS_ENV = ("PYTHONPATH", "NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS")


# ----------------------------------------------------------------------------- main
def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--url", help="a running vLLM-Omni server (not started or stopped here)")
    where.add_argument("--server-cmd", help="the server program our Supervisor launches (with --model)")
    parser.add_argument("--model", default=None,
                        help="launch the real server for this model folder (program: --server-cmd, default this "
                             "python running vllm's CLI main); without --model and --url: the stub server")
    parser.add_argument("--gpus", default="0", help="GPUs for a launched server, e.g. 0 or 0,1")
    parser.add_argument("--api-key-env", default=None, help="environment variable holding the --url server's key")
    parser.add_argument("--shapes", default=DEFAULT_SHAPES, help="WxHxF list")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--fps", type=float, default=24.0)
    parser.add_argument("--repeat", type=int, default=3, help="measured jobs per shape and poll mode")
    parser.add_argument("--warmup", type=int, default=1, help="unmeasured jobs per shape first")
    parser.add_argument("--poll-modes", default="fixed,due")
    parser.add_argument("--lever-repeat", type=int, default=3, help="runs per decode lever (0: skip levers)")
    parser.add_argument("--stub-step-s", type=float, default=0.05, help="stub only: seconds per denoise step")
    parser.add_argument("--natural", action="store_true",
                        help="also time the client path on a natural-content clip of each shape (natural_clip), "
                             "served like /content by bench/mp4_file_server.py (no GPU)")
    parser.add_argument("--serve-python", default=sys.executable,
                        help="python with starlette + uvicorn for --natural (default: this one)")
    args = parser.parse_args()

    import_package()
    shapes = parse_shapes(args.shapes)
    modes = [m for m in args.poll_modes.split(",") if m]
    if args.url:
        target = remote(args.url, args.api_key_env)
    elif args.server_cmd or args.model:
        if not args.model:
            parser.error("--server-cmd needs --model")
        server_cmd = shlex.split(args.server_cmd) if args.server_cmd else [sys.executable, "-c", VLLM_MAIN]
        extra_env = {"HF_HUB_OFFLINE": "1", **{k: os.environ[k] for k in PASS_ENV if os.environ.get(k)}}
        target = supervised(args.model, server_cmd, extra_env, tuple(int(g) for g in args.gpus.split(",")))
    else:
        sys.path.insert(0, str(ROOT / "tests" / "contract"))
        import stubserver

        target = supervised(STUB_MODEL, [stubserver.server_python(), stubserver.STUB_SCRIPT],
                            {"VLLM_OMNI_STUB_STEP_S": str(args.stub_step_s)}, (0,))
        target.info["stub_step_s"] = args.stub_step_s

    report: dict[str, Any] = {
        "bench": "overhead", "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": " ".join(sys.argv), "server": target.info, "steps": args.steps,
        "env": {"python": platform.python_version(), "numpy": np.__version__, "cpus": os.cpu_count(),
                "machine": platform.machine()},
        "jobs": [], "summary": [], "levers": {}, "natural": {},
    }
    estimates: dict[tuple[int, int, int], float] = {}
    try:
        seed = 1
        for shape in shapes:
            for _ in range(args.warmup):
                run_job(target, shape, args.steps, args.fps, seed, "fixed", estimates)
                seed += 1
            lever_input: Optional[tuple[bytes, Any]] = None
            kept: Optional[dict[str, Any]] = None
            runs = [mode for _ in range(args.repeat) for mode in modes]   # interleaved: drift hits all alike
            for i, mode in enumerate(runs):
                last = i == len(runs) - 1 and args.lever_repeat > 0   # kept on the server for the download levers
                row, mp4, req = run_job(target, shape, args.steps, args.fps, seed, mode, estimates, keep_job=last)
                seed += 1
                report["jobs"].append(row)
                lever_input = lever_input or (mp4, req)
                kept = row if last else kept
                say(f"{row['shape']} {mode:>5}: wall {row['wall_s']:.3f} s, inference "
                    f"{row['inference_time_s']} s, overhead {row['overhead_s']} s (detect {row['detect_s']}, "
                    f"download {row['download_s']}, decode {row['decode_s']}, read wait {row['read_wait_s']})")
            for mode in modes:
                rows = [r for r in report["jobs"] if r["shape"] == "x".join(map(str, shape)) and r["poll_mode"] == mode]
                report["summary"].append({"shape": rows[0]["shape"], "poll_mode": mode, "jobs": len(rows), **{
                    f"median_{k}": median([r[k] for r in rows])
                    for k in ("wall_s", "inference_time_s", "overhead_s", "submit_s", "detect_s", "download_s",
                              "decode_s", "read_wait_s")}})
            if kept is not None and lever_input is not None:
                key = "x".join(map(str, shape))
                try:
                    report["levers"][key] = levers(*lever_input, args.lever_repeat)
                    report["levers"][key]["download"] = download_levers(
                        target.url, target.api_key, kept["job_id"], lever_input[1].bounds(), args.lever_repeat,
                        tuple(kept["frames_shape"][:3]))
                finally:
                    from vllm_omni_launcher.client.api import VideoClient

                    with VideoClient(target.url, api_key=target.api_key) as client:
                        client.delete(kept["job_id"])
                say(f"{key} download levers: {json.dumps(report['levers'][key]['download'])}")
        if target.stop is not None:
            target.stop()                      # the natural clips need no server, and no GPU
            target.stop = None
        if args.natural:
            for shape in shapes:
                key = "x".join(map(str, shape))
                try:
                    report["natural"][key] = natural_levers(shape, max(1, args.lever_repeat), args.serve_python)
                except Exception as exc:  # noqa: BLE001 - a data point less; the jobs' numbers still print
                    report["natural"][key] = {"error": f"{type(exc).__name__}: {exc}"}
                say(f"{key} natural content: {json.dumps(report['natural'][key])}")
    except KeyboardInterrupt:                  # gpu_session.sh's timeout: keep what was measured
        report["interrupted"] = True
        say("interrupted: reporting what was measured")
    except Exception as exc:  # noqa: BLE001 - one device run: what was measured still prints
        report["error"] = f"{type(exc).__name__}: {exc}"
        say(f"failed: {report['error']}; reporting what was measured")
    finally:
        if target.stop is not None:
            target.stop()
    print(json.dumps(report, indent=1))
    return 1 if "error" in report else 0


if __name__ == "__main__":
    raise SystemExit(main())
