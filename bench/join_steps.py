"""The five steps of the head + joined-replica bench (bench/gpu_join.py's docstring lists them): start
both roles, jobs through the head, kill -9 of the joined runtime and the restarts it causes, jobs after,
and the stop with its process-group check. Each step fills its row of the report and saves it; every wait
is bounded by the run's deadline less the stop reserve, so the stop and the report always run.
"""
from __future__ import annotations

import argparse
import os
import re
import signal
import threading
import time
from pathlib import Path
from typing import Any, Callable, Optional

import gpu_join_report as report_of
import gpu_replicas
from join_runtime import Runtime
from throughput_bench import Clock, _gpu, run_jobs

from vllm_omni_launcher.client.api import VideoClient
from vllm_omni_launcher.models import family_for, request_for
from vllm_omni_launcher.server.config.local_config import LocalConfig
from vllm_omni_launcher.server.launch.spec import LaunchSpec, RuntimeConfig
from vllm_omni_launcher.server.process import probe
from vllm_omni_launcher.server.supervision.multi_host import HeadRole, JoinRole, probe_tcp
from vllm_omni_launcher.server.supervision.supervisor import Supervisor
from vllm_omni_launcher.server.supervision.wedge_watch import REACHABLE

STOP_RESERVE_S = 40.0          # stopping both runtimes, the process-group check and the report
ATTACH_S = 45.0                # the head logging the attach of a registered replica (within seconds)
SERVER_LOG_LINES = 3000
STALLED = "The head made no progress for"


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
