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
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import gpu_join_report as report_of  # noqa: E402
import gpu_replicas  # noqa: E402
from throughput_bench import Clock, _gpu, gpu_name, parse_shape, run_jobs, say, servers  # noqa: E402

from vllm_omni_launcher.client.api import VideoClient  # noqa: E402
from vllm_omni_launcher.models import family_for, request_for  # noqa: E402
from vllm_omni_launcher.server.launch import versions  # noqa: E402
from vllm_omni_launcher.server.process import probe  # noqa: E402
from vllm_omni_launcher.server.config.local_config import LocalConfig  # noqa: E402
from vllm_omni_launcher.server.supervision.multi_host import HeadRole, JoinRole, probe_tcp  # noqa: E402
from vllm_omni_launcher.server.launch.spec import LaunchSpec, RuntimeConfig  # noqa: E402
from vllm_omni_launcher.server.supervision.status import Status  # noqa: E402
from vllm_omni_launcher.server.supervision.supervisor import Supervisor  # noqa: E402
from vllm_omni_launcher.server.supervision.wedge_watch import REACHABLE  # noqa: E402

OUT = ROOT / "bench" / "results" / "h200-join-vllm-omni-0.26" / "tiny-ti2v.json"
STOP_RESERVE_S = 40.0          # stopping both runtimes, the process-group check and the report
ATTACH_S = 45.0                # the head logging the attach of a registered replica (within seconds)
SERVER_LOG_LINES = 3000
STALLED = "The head made no progress for"


class Runtime:
    """One supervised role: its Supervisor, the statuses it reported (with times), every generation's
    log text (read while it exists: old logs get pruned) and every process of every generation."""

    def __init__(self, name: str, sup: Supervisor, t0: float) -> None:
        self.name, self.sup, self.t0 = name, sup, t0
        self.seen: list[tuple[float, Status]] = []
        self.logs: dict[str, str] = {}
        self.pgids: set[int] = set()
        self.pids: set[int] = set()

    def on_status(self, status: Status) -> None:
        self.seen.append((round(time.monotonic() - self.t0, 1), status))

    def first(self, text: str, after: float = 0.0) -> Optional[float]:
        """When a status (text or last error) containing `text` was first reported after `after`."""
        return next((t for t, s in self.seen if t >= after and (text in s.text or text in (s.last_error or ""))),
                    None)

    def generation_at(self, t: float) -> int:
        """The generation of the last status reported at or before `t`."""
        return max((s.generation for when, s in self.seen if when <= t), default=self.sup.generation)

    def log(self) -> str:
        """The current generation's log (cached with the earlier ones)."""
        path = self.sup.log_path
        if path:
            try:
                self.logs[path] = Path(path).read_text(errors="replace")
            except OSError:
                pass
        return self.logs.get(path or "", "")

    def all_logs(self) -> str:
        """Every generation's log still on disk (and the cached ones already pruned), oldest first."""
        current = self.log()
        folder = Path(self.sup.log_path).parent if self.sup.log_path else None
        for path in sorted(folder.glob("*.log"), key=lambda p: p.stat().st_mtime_ns) if folder else []:
            try:
                self.logs[str(path)] = path.read_text(errors="replace")
            except OSError:
                pass
        return "\n".join(self.logs.values()) if self.logs else current

    def note_processes(self) -> list[dict[str, Any]]:
        """The live process group now; remembered for the stop check and the NVML split."""
        pgid = self.sup.pgid
        members = gpu_replicas.group_members(pgid)
        if pgid is not None:
            self.pgids.add(pgid)
        self.pids |= {m["pid"] for m in members}
        return members

    def timeline(self) -> list[str]:
        out, last = [], None
        for t, s in self.seen:
            line = f"{t} {s.phase} g{s.generation}: {s.text}"[:300]
            if line != last:
                out.append(line)
            last = line
        return out[-40:]


class JoinBench:
    """The five steps, each filling `steps[name]`; `stop()` always runs."""

    def __init__(self, args: argparse.Namespace, report: dict[str, Any], save: Callable[[], None],
                 server_cmd: list[str], extra_env: dict[str, str], data_dir: str) -> None:
        self.args, self.report, self.save = args, report, save
        self.clock = Clock(args.deadline_s)
        self.t0 = self.clock.t0
        self.steps: dict[str, dict[str, Any]] = report["steps"]
        self.port = probe.free_port()
        self.gpu = _gpu()
        spec = LaunchSpec(model=args.model, gpus=(0,),
                          runtime=RuntimeConfig(enforce_eager=True) if args.eager else RuntimeConfig())
        env = {**extra_env, "CUDA_VISIBLE_DEVICES": "0"}

        def config(where: str, **changes: Any) -> LocalConfig:
            # head and joined replica share GPU 0 on purpose (two machines on one box): each its own GPU lock folder
            return LocalConfig(server_command=tuple(server_cmd), data_dir=os.path.join(data_dir, where),
                               gpu_lock_dir=os.path.join(data_dir, where, "gpu-locks"), extra_env=env,
                               startup_timeout_s=1200, **changes)
        head_cfg, join_cfg = config("head", head_stall_timeout_s=args.stall_s), config("join")
        self.head = Runtime("head", Supervisor(spec, head_cfg, role=HeadRole.from_config(self.port, head_cfg)),
                            self.t0)
        self.join = Runtime("joined", Supervisor(spec, join_cfg, api_key=False,
                                                 role=JoinRole.from_config(f"127.0.0.1:{self.port}", join_cfg)),
                            self.t0)
        self.attach_logged = True
        report.update(registration=f"127.0.0.1:{self.port}", flags=spec.flags())

    # ------------------------------------------------------------------ helpers
    def now(self) -> float:
        return round(time.monotonic() - self.t0, 1)

    def budget(self) -> float:
        """Seconds a wait may take before the stop reserve."""
        return max(0.0, self.clock.left() - STOP_RESERVE_S)

    def wait(self, cond: Callable[[], Any], limit: float, poll: float = 0.5) -> Any:
        """cond() until truthy, for at most `limit` seconds and the deadline; its last value."""
        end = time.monotonic() + min(limit, self.budget())
        while True:
            got = cond()
            if got or time.monotonic() >= end:
                return got
            time.sleep(poll)

    def attached(self) -> int:
        """`attached remote replica` lines in the head's current generation's log. A head that never
        logged one (another wording) counts the joined runtime's own registration lines instead
        (printed once the head answered its handshake)."""
        if self.attach_logged:
            return len(report_of.ATTACHED.findall(self.head.log()))
        return int(self.join.sup.ready())

    def client(self) -> VideoClient:
        sup = self.head.sup
        return VideoClient(sup.url or "", api_key=sup.api_key, server_version=sup.server_version)

    def submit(self, client: VideoClient, seed: int) -> str:
        w, h, f = self.args.shape
        req = request_for(family_for(self.args.model), prompt="a red fox in snow", width=w, height=h, frames=f,
                          fps=16, steps=self.args.steps, seed=seed)
        job = client.submit(req)
        self.head.sup.mark_job_activity()
        return job

    def gpu_memory(self) -> dict[str, Any]:
        procs = self.gpu.processes()
        by_pid = gpu_replicas.gpu_mib_by_pid(procs)
        return {"by_pid_mib": by_pid, "by_runtime_mib": report_of.gpu_mib_by_runtime(
            by_pid, {self.head.name: self.head.pids, self.join.name: self.join.pids}) if by_pid else procs}

    def step(self, name: str, **fields: Any) -> dict[str, Any]:
        self.steps[name] = {"status": "running", **fields}
        self.save()
        return self.steps[name]

    def skip_rest(self, why: str, names: tuple[str, ...] = ("head", "join", "jobs", "kill", "after")) -> None:
        for name in names:
            self.steps.setdefault(name, {"status": f"skipped: {why}"})

    # ------------------------------------------------------------------ steps 1 + 2
    def start_both(self) -> bool:
        head, join = self.step("head"), self.step("join", start="sequential" if self.args.sequential
                                                    else "when the registration port accepts")
        errors: dict[str, str] = {}

        def start(rt: Runtime) -> None:
            try:
                rt.sup.start(on_status=rt.on_status, timeout=max(60.0, self.budget()))
            except Exception as exc:      # recorded; the other role and the stop still run
                errors[rt.name] = f"{type(exc).__name__}: {exc}"[:1500]

        threads = [threading.Thread(target=start, args=(self.head,), daemon=True)]
        threads[0].start()
        def port_open() -> bool:
            return probe_tcp("127.0.0.1", self.port, 1.0) == REACHABLE
        self.wait(lambda: port_open() or not threads[0].is_alive(), self.budget(), 0.5)
        head["registration_port_open_s"] = self.now() if port_open() else None
        if self.args.sequential:
            threads[0].join(self.budget())
        threads.append(threading.Thread(target=start, args=(self.join,), daemon=True))
        threads[1].start()
        join["started_s"] = self.now()
        for t in threads:
            t.join(self.budget() + 5)
        for rt, row in ((self.head, head), (self.join, join)):
            row["status"] = "ok" if rt.sup.ready() else f"failed: {errors.get(rt.name, 'not ready')}"
            row["t_s"] = rt.first("Ready")
            row["ready_text"] = rt.sup.status().text[:300]
            row["argv"] = " ".join(rt.sup._run.argv)[:900] if rt.sup._run else None   # noqa: SLF001
            row["processes_at_ready"] = len(rt.note_processes())
        if not (self.head.sup.ready() and self.join.sup.ready()):
            for rt in (self.head, self.join):
                self.steps["head" if rt is self.head else "join"]["log_tail"] = rt.sup.tail(30)
            self.skip_rest("a role did not start")
            return False
        self.attach_logged = bool(self.wait(self.attached, ATTACH_S))
        join["head_attached_s"] = self.now() if self.attach_logged else None
        if not self.attach_logged:      # routing still shows in the jobs' `add request` lines
            join["note"] = (f"the head logged no `attached remote replica` line in {ATTACH_S:g} s; the joined "
                            "runtime's registration line stands for it")
        join["registered_lines"] = report_of.evidence(self.join.log(), 4)
        join["gpu_memory"] = self.gpu_memory()
        self.save()
        return True

    # ------------------------------------------------------------------ step 3 (and 4b)
    def jobs(self, name: str, count: int, seed0: int) -> bool:
        row = self.step(name, jobs=count)
        join_runs = report_of.finished_runs(self.join.all_logs(), self.args.steps)
        try:
            with self.client() as client:
                row.update(run_jobs(client, self.args, count, seed0, self.clock, self.head.sup))
            row["status"] = "ok"
        except Exception as exc:
            row["status"] = f"failed: {type(exc).__name__}: {exc}"[:1500]
            row["head_tail"] = self.head.sup.tail(20)
        row["t_s"] = self.now()
        if "per_job" in row:
            time.sleep(1.0)                    # the joined runtime's last bar reaches its log
            runtime = report_of.runtime_of_jobs(self.head.all_logs(), [j["job"] for j in row["per_job"]])
            for job in row["per_job"]:
                job["runtime"] = runtime[job["job"]]
            row["jobs_per_runtime"] = report_of.jobs_per_runtime(runtime)
        row["joined_log_finished_runs"] = report_of.finished_runs(self.join.all_logs(), self.args.steps) - join_runs
        self.save()
        return row["status"] == "ok"

    # ------------------------------------------------------------------ step 4
    def kill(self) -> bool:
        head_ready = self.steps["head"].get("t_s") or 120.0
        need = self.args.stall_s + 15 + 1.3 * head_ready + 30
        if self.budget() < need:
            self.steps["kill"] = {"status": f"skipped: needs ~{need:.0f} s, {self.budget():.0f} s left"}
            return False
        row = self.step("kill")
        head_gen, join_gen = self.head.sup.generation, self.join.sup.generation
        victim = self.join.sup.status().pid
        os.kill(victim, signal.SIGKILL)
        row.update(victim_pid=victim, t_s=self.now())
        kill_t = row["t_s"]
        row["join_restarting_s"] = self.wait(lambda: self.join.first("restarting in", kill_t), 90)
        with self.client() as client:
            row["wedge_jobs"] = [self.submit(client, seed) for seed in (101, 102)]
        attached_before = self.attached()

        def rejoined(after_gen: int) -> bool:
            """A joined generation newer than `after_gen` is ready and attached by the head that runs now."""
            if not (self.join.sup.generation > after_gen and self.join.sup.ready() and self.head.sup.ready()):
                return False
            if not self.attach_logged:
                return True
            return self.attached() > (attached_before if self.head.sup.generation == head_gen else 0)
        # upstream's head wedges when a remote replica dies (the stall watch restarts it); a head that
        # does not wedge would attach the restarted replica itself and end the wedge jobs
        settled = self.wait(lambda: self.head.first(STALLED, kill_t) or
                           (rejoined(join_gen) and not self._waiting(row["wedge_jobs"])), self.args.stall_s + 120, 1.0)
        stalled_at = self.head.first(STALLED, kill_t)
        row["head_stall_restart_s"] = stalled_at
        row["head_wedged"] = stalled_at is not None
        if stalled_at is not None:
            row["head_ready_again_s"] = self.wait(lambda: self.head.sup.generation > head_gen and self.head.sup.ready()
                                                  and self.now(), 600)
        # the joined generation that ran when the head restarted is itself restarted (its head is gone)
        before = self.join.generation_at(stalled_at) if stalled_at is not None else join_gen
        row["joined_registered_again_s"] = self.wait(lambda: rejoined(before) and self.now(), 600)
        row["generations"] = {"head": self.head.sup.generation, "joined": self.join.sup.generation}
        row["victim_alive"] = bool(gpu_replicas.still_alive([victim]))
        row["joined_saw_head_lost"] = self.join.first("head's registration port") is not None
        row["head_last_error"] = (self.head.sup.status().last_error or "")[:300]
        row["wedge_job_states"] = self._states(row["wedge_jobs"])
        for rt in (self.head, self.join):
            rt.note_processes()
        row["gpu_memory"] = self.gpu_memory()
        ok = bool(settled) and bool(row["joined_registered_again_s"])
        row["status"] = "ok" if ok else "failed: " + ("no restart or re-registration within the limit")
        self.save()
        return ok

    def _states(self, jobs: list[str]) -> dict[str, Optional[str]]:
        """Each job's status at the head that runs now (None: it does not know the job, e.g. after a restart)."""
        out: dict[str, Optional[str]] = {}
        if not self.head.sup.ready():
            return {j: "head not ready" for j in jobs}
        try:
            with self.client() as client:
                for job in jobs:
                    try:
                        out[job] = client.status(job).status
                    except Exception as exc:      # e.g. a restarted head does not know the job (404)
                        out[job] = f"{type(exc).__name__}: {exc}"[:160]
        except Exception as exc:
            return {j: f"{type(exc).__name__}" for j in jobs}
        return out

    def _waiting(self, jobs: list[str]) -> bool:
        return any(s in ("queued", "in_progress") for s in self._states(jobs).values())

    # ------------------------------------------------------------------ step 5
    def stop(self) -> None:
        row = self.steps.setdefault("stop", {})
        row["t_s"] = self.now()
        for rt in (self.head, self.join):
            try:
                rt.note_processes()
                rt.all_logs()
            except Exception:
                pass
        t = time.monotonic()
        for rt in (self.join, self.head):
            try:
                rt.sup.stop()
            except Exception as exc:
                row[f"{rt.name}_stop_error"] = f"{type(exc).__name__}: {exc}"[:300]
        row["stop_s"] = round(time.monotonic() - t, 2)
        pids = self.head.pids | self.join.pids
        gone = self.settle(lambda: not gpu_replicas.still_alive(pids) and not self._group_left(), 30)
        row["pgids"] = {rt.name: sorted(rt.pgids) for rt in (self.head, self.join)}
        row["processes_seen"] = {rt.name: len(rt.pids) for rt in (self.head, self.join)}
        row["left_after_stop"] = sorted(set(gpu_replicas.still_alive(pids)) | set(self._group_left()))
        row["gpu_processes_after_stop"] = self.gpu.processes()
        row["status"] = "ok" if gone else f"failed: {len(row['left_after_stop'])} process(es) left"
        self.gpu.close()

    def _group_left(self) -> list[int]:
        return [m["pid"] for rt in (self.head, self.join) for g in rt.pgids for m in gpu_replicas.group_members(g)]

    @staticmethod
    def settle(cond: Callable[[], bool], limit: float) -> bool:
        end = time.monotonic() + limit
        while not cond():
            if time.monotonic() >= end:
                return False
            time.sleep(0.5)
        return True

    def finish(self) -> None:
        """Timelines and logs into the report (and the server logs folder)."""
        self.report["timeline"] = {rt.name: rt.timeline() for rt in (self.head, self.join)}
        self.report["log_evidence"] = {rt.name: report_of.evidence(rt.all_logs(), 24) for rt in (self.head, self.join)}
        if self.args.server_logs:
            folder = Path(self.args.server_logs)
            folder.mkdir(parents=True, exist_ok=True)
            for rt in (self.head, self.join):
                for path, text in rt.logs.items():
                    gen = re.search(r"-g(\d+)\.log$", path)
                    tail = "\n".join(text.splitlines()[-SERVER_LOG_LINES:])
                    name = f"{self.args.label}-{rt.name}-g{gen.group(1) if gen else 'x'}.server.log"
                    (folder / name).write_text(tail + "\n")

    def run(self) -> None:
        if not self.start_both():
            return
        if not self.jobs("jobs", self.args.jobs, 1):
            self.skip_rest("the jobs did not complete", ("kill", "after"))
            return
        if self.args.no_kill:
            self.skip_rest("--no-kill", ("kill", "after"))
            return
        if not self.kill():
            self.skip_rest("the restart step did not finish", ("after",))
            return
        if self.budget() < 30:
            self.skip_rest(f"{self.budget():.0f} s left", ("after",))
            return
        self.jobs("after", self.args.jobs_after, 201)


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
