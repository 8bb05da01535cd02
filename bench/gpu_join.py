"""A head and a joined replica on one GPU, through our own roles (issue 17's `--join` on the lent H200).

One Python driver runs both roles as our Supervisor objects, as tests/contract/test_join_head.py does
on CPU, rather than two `serve` CLIs: the CLI's `run` adds only the planner's resolution, the key file
and Ctrl-C around exactly these objects (`HeadRole.from_config`, `JoinRole.from_config`, `Supervisor(...,
role=...)`, the join one without an API key), and one process can read both supervisors' state
(generations, statuses, process groups) without parsing CLI output. The steps:

1. the head through `HeadRole` (what `serve --accept-replicas PORT` runs; registration on 127.0.0.1,
   round-robin), its own replica on GPU 0;
2. a joined replica through `JoinRole` (what `serve --join 127.0.0.1:PORT` runs), also on GPU 0. It is
   started once the head's registration port accepts a connection (the CLI's `reachable()` check),
   so its engine loads while the head's does (`--sequential`: after the head is ready);
3. N jobs to the head's /v1/videos through our VideoClient, all at once: which runtime ran each is the
   head's `[rep-K] add request` line against its `attached remote replica ... replica=K` lines, and the
   joined runtime's own log shows its finished denoise bars (bench/gpu_join_report.py);
4. kill -9 of the joined runtime: its supervisor restarts it (a crash); two jobs are sent, one lands
   on the dead replica; the head's wedge watch (head_stall_timeout_s = --stall-s) restarts the head if
   upstream wedges; the joined replica (restarted again when the head's port refuses) registers with
   the head that runs; then --jobs-after jobs, all must complete;
5. Stop of both: every process group that ever ran (each generation's) must be empty; NVML memory
   per process (and per runtime) after the first registration and after the restarts.

Every step is bounded by --deadline-s (what does not fit is marked skipped); SIGINT (the device
phase's `timeout -s INT`) stops both and writes what was measured. The JSON report is rewritten
after every step; `python bench/gpu_join_report.py DIR` writes the README table.

    python bench/gpu_join.py --vllm --model DIR --eager --jobs 6 --stall-s 25 --deadline-s 290 \\
        --out J/tiny-ti2v.json --server-logs J                      (bench/gpu_session.sh J, on the device)
    VLLM_OMNI_LAUNCHER_TEST_SERVER_PYTHON=$PWD/.venv-server/bin/python .venv/bin/python bench/gpu_join.py \\
        --server-cmd "$PWD/.venv-server/bin/python tests/contract/stub_vllm_serve.py" ...   (cpu-j)

The steps are bench/join_steps.py's (`JoinBench`), a role's record bench/join_runtime.py's (`Runtime`);
this file is the entry point (`python -m bench.gpu join`): options, the report's header, and the run.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from join_steps import JoinBench  # noqa: E402
from throughput_bench import gpu_name, parse_shape, say, servers  # noqa: E402

from vllm_omni_launcher.server.launch import versions  # noqa: E402

OUT = ROOT / "bench" / "results" / "h200-join-vllm-omni-0.26" / "tiny-ti2v.json"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="Diffusers model folder (the kit's tiny TI2V) or id")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--vllm", action="store_true", help="the real server: vLLM's CLI main in this python")
    where.add_argument("--server-cmd", default=None, help="the server program both Supervisors launch (the stub)")
    parser.add_argument("--eager", action="store_true", help="--enforce-eager (no torch.compile warm-up)")
    parser.add_argument("--jobs", type=int, default=6, help="jobs submitted at once in step 3 (default 6)")
    parser.add_argument("--jobs-after", type=int, default=4, help="jobs after the restarts (default 4)")
    parser.add_argument("--steps", type=int, default=6, help="denoise steps per job (default 6)")
    parser.add_argument("--step-s", type=float, default=0.25, help="stub seconds per step (default 0.25)")
    parser.add_argument("--shape", type=parse_shape, default=(256, 128, 9), help="WxHxF (default 256x128x9)")
    parser.add_argument("--poll-s", type=float, default=0.2, help="seconds between status rounds (default 0.2)")
    parser.add_argument("--stall-s", type=float, default=25.0, help="the head's head_stall_timeout_s (default 25)")
    parser.add_argument("--sequential", action="store_true", help="start the joined replica after the head is ready")
    parser.add_argument("--no-kill", action="store_true", help="steps 1-3 and 5 only")
    parser.add_argument("--deadline-s", type=float, default=None, help="seconds for everything (default none)")
    parser.add_argument("--server-logs", default=None, help="folder for every generation's server log")
    parser.add_argument("--label", default="tiny-ti2v", help="the run's name in the README (default tiny-ti2v)")
    parser.add_argument("--out", default=str(OUT), help=f"JSON result (default {OUT.relative_to(ROOT)})")
    args = parser.parse_args()
    args.one_gpu = False                 # throughput_bench.servers: each runtime has one replica, on GPU 0
    server_cmd, extra_env, what = servers(args)
    found = versions.detect(server_cmd, extra_env=extra_env)
    w, h, f = args.shape
    report: dict[str, Any] = {
        "bench": "gpu_join", "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "label": args.label,
        "command": "python " + " ".join(shlex.quote(a) for a in ["bench/gpu_join.py", *sys.argv[1:]]),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version(),
                    "gpu": gpu_name()},
        "server": what, "model": args.model,
        "server_versions": None if found is None else {"python": found.python, "vllm": found.vllm,
                                                       "vllm_omni": found.vllm_omni},
        "driver": "one Python process, both roles as Supervisor objects (HeadRole / JoinRole, as serve builds them)",
        "request": f"{w}x{h}, {f} frames, one seed per job", "denoise_steps": args.steps, "eager": args.eager,
        "stall_s": args.stall_s, "deadline_s": args.deadline_s, "jobs": args.jobs, "steps": {},
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)

    def save() -> None:
        out.write_text(json.dumps(report, indent=2, default=str) + "\n")

    with tempfile.TemporaryDirectory(prefix="gpu-join-") as tmp:
        bench = JoinBench(args, report, save, server_cmd, extra_env, tmp)
        try:
            bench.run()
        except KeyboardInterrupt:
            report["interrupted"] = "SIGINT (the phase's time limit); both runtimes were stopped"
            for row in report["steps"].values():
                if row.get("status") == "running":
                    row["status"] = "interrupted (SIGINT)"
            say(report["interrupted"])
        finally:
            bench.stop()
            bench.finish()
            save()
    for name, row in report["steps"].items():
        say(f"{name}: {row.get('status')} at {row.get('t_s')} s")
    print(f"wrote {args.out}")
    return 0 if all(r.get("status") == "ok" for r in report["steps"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
