"""Several machines (issue 17) against the real vLLM-Omni 0.30 on loopback: a head started the way
`serve --accept-replicas PORT` starts it, a replica joined the way `serve --join 127.0.0.1:PORT`
joins it (both Supervisors with the stub as their `vllm`, fake GPU), and what happens when the
joined replica is killed.

What upstream does then (docs/replicas.md, section 3): the head's coordinator drops the dead
replica after its heartbeat timeout (30 s) and the head wedges; a job sent to the dead replica
never ends. The launcher: the replica's supervisor restarts it (a crash), the head's stall watch
sees jobs waiting with nothing moving and restarts the head, and the replica, whose head is gone,
is restarted again and registers with the new head, which then routes jobs to it.

One test function, because every process costs a vLLM import: the head is an API process, the
coordinator process and its own replica process (3), a joined runtime its main process and one
replica process (2). Over the test: 2 head generations and 3 joined generations (the restart after
the kill is itself ended when the head restarts under it), about 12 vLLM imports, 11 minutes on
a busy 2-core box.
"""
from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Optional

import stubserver
from stubserver import wait_for
from test_supervisor import alive, data_dir, stub_pids, submit, wait_job  # noqa: F401 (fixture)

from vllm_omni_launcher.server import probe, process_group
from vllm_omni_launcher.server.local_config import LocalConfig
from vllm_omni_launcher.server.logwatch import DenoiseProgress
from vllm_omni_launcher.server.multi_host import HeadRole, JoinRole
from vllm_omni_launcher.server.registry import Status, Supervisor
from vllm_omni_launcher.server.spec import LaunchSpec

TI2V = "Wan-AI/Wan2.2-TI2V-5B-Diffusers"
START_S = 900.0          # a start on a loaded 2-core box: each process imports vLLM
STALL_S = 25.0           # the head's stall timeout here (the default is 30 minutes)


def _config(data_dir: Path, **changes: object) -> LocalConfig:
    return LocalConfig(server_command=(stubserver.server_python(), str(stubserver.STUB_SCRIPT)),
                       data_dir=str(data_dir), startup_timeout_s=START_S,
                       extra_env={"VLLM_OMNI_STUB_STEP_S": "0.2", "CUDA_VISIBLE_DEVICES": "0"}, **changes)


def _log(sup: Supervisor) -> str:
    return Path(sup.log_path or "").read_text(errors="replace")


def _group_empty(pgid: int) -> bool:
    return not process_group.group_members(pgid)


def _joined_replica_runs_one(head: Supervisor, join: Supervisor, seeds: tuple[int, ...],
                             after_run_id: Optional[int]) -> DenoiseProgress:
    """Submit jobs to the head two at a time until the joined replica has run one; its progress.

    Two at a time with round-robin puts one on each replica once the head's routing lists the
    joined one. "attached remote replica" in the head's log comes a little before that: the head
    routes from the coordinator's replica list, which it refreshes on its own, so on a loaded box
    the first pair can still both go to the head's own replica. Every job must complete."""
    def joined_ran() -> Optional[DenoiseProgress]:
        p = join.progress()
        return p if p is not None and p.done and (after_run_id is None or p.run_id > after_run_id) else None
    for pair in zip(seeds[::2], seeds[1::2]):
        jobs = [submit(head, steps=3, seed=s) for s in pair]
        assert [wait_job(head, j)["status"] for j in jobs] == ["completed", "completed"]
        try:        # the joined runtime's log is read by its follower thread: a moment behind
            return wait_for(joined_ran, 15, "the joined replica's log to show the job it ran")
        except AssertionError:
            continue
    raise AssertionError(f"the head ran {len(seeds)} jobs and routed none to the joined replica")


def test_a_joined_replica_serves_the_heads_jobs_and_both_recover_from_its_kill(data_dir: Path) -> None:  # noqa: F811
    port = probe.free_port()
    head_seen: list[Status] = []
    join_seen: list[Status] = []
    head_cfg = _config(data_dir / "head", head_stall_timeout_s=STALL_S)
    join_cfg = _config(data_dir / "join")
    head = Supervisor(LaunchSpec(TI2V, gpus=(0,)), head_cfg, role=HeadRole.from_config(port, head_cfg))
    join = Supervisor(LaunchSpec(TI2V, gpus=(0,)), join_cfg, api_key=False,
                      role=JoinRole.from_config(f"127.0.0.1:{port}", join_cfg))
    pgids: list[int] = []
    try:
        head.start(on_status=head_seen.append, timeout=START_S)
        assert f"accepting replicas on 127.0.0.1:{port}" in head.status().text
        assert f"--omni-master-port {port}" in " ".join(head._run.argv)                       # noqa: SLF001
        join.start(on_status=join_seen.append, timeout=START_S)
        assert join.status().text.startswith("Ready: 1 replica of " + TI2V), join.status().text
        assert "--headless" in join._run.argv and "--port" not in join._run.argv              # noqa: SLF001
        wait_for(lambda: "attached remote replica" in _log(head), 60, "the head to attach the joined replica")
        pgids += [head.pgid, join.pgid]

        # -- routed: the head sends jobs to the joined replica, whose own process runs them
        ran = _joined_replica_runs_one(head, join, seeds=(1, 2, 3, 4, 5, 6), after_run_id=None)
        assert ran.done and ran.total == 3                            # its steps, in the joined runtime's log

        # -- kill -9 of the joined runtime: our supervisor restarts it; the head wedges and is restarted
        victim = join.status().pid
        os.kill(victim, signal.SIGKILL)
        wait_for(lambda: any("restarting in" in s.text for s in join_seen), 60, "the joined replica's restart")
        for seed in (7, 8):
            submit(head, steps=3, seed=seed)                          # one goes to the dead replica: never ends
        wanted = "The head made no progress for"
        wait_for(lambda: any(wanted in s.text for s in head_seen), START_S, "the head's stall watch")
        after = head.status()
        assert "wedges when a remote replica dies" in (after.last_error or "")
        assert head.wait_ready(START_S) and head.generation == 2
        assert head.status().text.startswith(f"Restarted after: {wanted}"), head.status().text

        # -- the joined replica registers with the new head (again restarted: its old head is gone)
        wait_for(lambda: join.ready() and "attached remote replica" in _log(head), START_S,
                 "the joined replica to register with the restarted head")
        assert join.generation >= 3 and not alive(victim)
        assert any("head's registration port" in (s.last_error or "") for s in join_seen)
        pgids += [head.pgid, join.pgid]
        now = _joined_replica_runs_one(head, join, seeds=(9, 10, 11, 12, 13, 14), after_run_id=ran.run_id)
        assert now.done and now.total == 3                            # the new replica ran one of them
    finally:
        join.stop()
        head.stop()
    for where in ("head", "join"):
        pids = stub_pids(data_dir / where)
        wait_for(lambda: not any(alive(p) for p in pids), 30, f"the {where}'s stub processes {pids} to exit")
    for pgid in pgids:
        wait_for(lambda: _group_empty(pgid), 30, f"process group {pgid} to empty")
