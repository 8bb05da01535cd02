"""Several machines against the real vLLM-Omni 0.30: a head started the way `serve --accept-replicas
PORT` starts it and a replica joined the way `serve --join HEAD:PORT` joins it (both Supervisors with
the stub as their `vllm`, fake GPU), on two boxes: the head in this machine's network namespace, the
replica in a namespace of its own, joined by a veth pair (two_boxes.py), so registration, the head's
per-replica ports and the heartbeats cross a real link and nothing can go over loopback. Where namespaces cannot be made (not root, no `ip`), the same test
runs on loopback and says so (a pytest warning naming the reason), without the network faults.

On the two boxes, in one run:
* a firewall refusing the registration port: `serve --join`'s reachability check refuses with
  "not reachable (unreachable)" before anything starts;
* registration from the replica box's address, and the joined runtime connected to the head's
  per-replica ports on the head's address (docs/deploy/README.md, "Ports");
* routing: the head sends jobs to the joined replica, whose own process runs them;
* a pulled cable while the joined replica runs a job, until it finished the job offline (about 8 s):
  nothing restarts, and the job completes once the link is back (a link loss longer than upstream's
  30 s heartbeat is bench/netns_head_replica.py's case, run by hand: it restarts both sides);
* kill -9 of the joined runtime: upstream's head drops the dead replica after its heartbeat timeout
  (30 s) and wedges, and a job sent to the dead replica never ends (docs/replicas.md, section 3).
  The launcher: the replica's supervisor restarts it (a crash), the head's stall watch sees jobs
  waiting with nothing moving and restarts the head, and the replica, whose head is gone, is
  restarted again and registers with the new head, which then routes jobs to it.

One test function, because every process costs a vLLM import: the head is an API process, the
coordinator process and its own replica process (3), a joined runtime its main process and one
replica process (2). Over the test: 2 head generations and 3 joined generations (the restart after
the kill is itself ended when the head restarts under it), about 12 vLLM imports, 11 minutes on
a busy 2-core box; the network faults add no process.
"""
from __future__ import annotations

import os
import signal
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, TypeVar

import pytest

import stubserver
from stubserver import wait_for
from processes import alive, stub_pids
from supervised_jobs import submit, wait_job
from two_boxes import ESTABLISHED, Boxes, tcp_sockets

from vllm_omni_launcher.errors import LauncherError
from vllm_omni_launcher.server.process import probe, process_group
from vllm_omni_launcher.server.config.local_config import LocalConfig
from vllm_omni_launcher.server.logs.logwatch import DenoiseProgress
from vllm_omni_launcher.server.supervision.multi_host import HeadRole, JoinRole, probe_tcp
from vllm_omni_launcher.server.registry import Status, Supervisor
from vllm_omni_launcher.server.launch.spec import LaunchSpec

T = TypeVar("T")
TI2V = "Wan-AI/Wan2.2-TI2V-5B-Diffusers"
START_S = 900.0          # a start on a loaded 2-core box: each process imports vLLM
STALL_S = 25.0           # the head's stall timeout here (the default is 30 minutes)
STEP_S = 0.2             # the stub's seconds per denoise step
LONG_STEPS = 40          # a job that is still denoising on the replica while its cable is out (8 s)


class Network:
    """Where the head and the replica run: two boxes (the head here, the replica in its namespace), or
    both on this machine's loopback."""

    def __init__(self, boxes: Optional[Boxes]) -> None:
        self.boxes = boxes
        self.head_ip = boxes.head_address if boxes else "127.0.0.1"
        self.replica_ip = boxes.replica_address if boxes else "127.0.0.1"

    def on_replica(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return self.boxes.run_in(fn, *args, **kwargs) if self.boxes else fn(*args, **kwargs)


@pytest.fixture
def network() -> Iterator[Network]:
    boxes, why = Boxes.make()
    if boxes is None:
        warnings.warn(f"test_join_head runs head and replica on loopback, without the cut-link and blocked-port "
                      f"cases: {why}")
    try:
        yield Network(boxes)
    finally:
        if boxes is not None:
            boxes.close()


def _config(where: Path, **changes: object) -> LocalConfig:
    """The head and the joined replica stand for two machines that share "GPU 0": each its own GPU lock folder."""
    return LocalConfig(server_command=(stubserver.server_python(), str(stubserver.STUB_SCRIPT)),
                       data_dir=str(where), gpu_lock_dir=str(where / "gpu-locks"), startup_timeout_s=START_S,
                       extra_env={"VLLM_OMNI_STUB_STEP_S": str(STEP_S), "CUDA_VISIBLE_DEVICES": "0"}, **changes)


def _log(sup: Supervisor) -> str:
    return Path(sup.log_path or "").read_text(errors="replace")


def _group_empty(pgid: int) -> bool:
    return not process_group.group_members(pgid)


def _head_ports_in_use(join: Supervisor, head_ip: str) -> set[int]:
    """The head's ports the joined runtime's processes hold TCP connections to."""
    pids = [p.pid for p in process_group.group_members(join.pgid or 0)]
    return {rport for _, _, rip, rport in tcp_sockets(pids, ESTABLISHED) if rip == head_ip}


def _joined_replica_runs_one(head: Supervisor, join: Supervisor, seeds: tuple[int, ...],
                             after_run_id: Optional[int], steps: int = 3,
                             while_running: Optional[Callable[[DenoiseProgress], None]] = None) -> DenoiseProgress:
    """Submit jobs to the head two at a time until the joined replica has run one; its progress.

    Two at a time with round-robin puts one on each replica once the head's routing lists the
    joined one. "attached remote replica" in the head's log comes a little before that: the head
    routes from the coordinator's replica list, which it refreshes on its own, so on a loaded box
    the first pair can still both go to the head's own replica. Every job must complete.
    `while_running(progress)` runs once the joined replica is in the middle of its job's denoise."""
    def joined(done: bool) -> Callable[[], Optional[DenoiseProgress]]:
        def look() -> Optional[DenoiseProgress]:
            p = join.progress()
            fresh = p is not None and (after_run_id is None or p.run_id > after_run_id)
            return p if fresh and (p.done if done else 1 <= p.step < p.total) else None
        return look
    for pair in zip(seeds[::2], seeds[1::2]):
        jobs = [submit(head, steps=steps, seed=s) for s in pair]
        if while_running is not None:
            try:
                while_running(wait_for(joined(done=False), steps * STEP_S * 4 + 30, "the joined replica's job"))
            except AssertionError:
                pass                                    # both went to the head's replica: the next pair
        assert [wait_job(head, j, timeout=120 + steps * STEP_S * 4)["status"] for j in jobs] == ["completed"] * 2
        try:        # the joined runtime's log is read by its follower thread: a moment behind
            return wait_for(joined(done=True), 15, "the joined replica's log to show the job it ran")
        except AssertionError:
            continue
    raise AssertionError(f"the head ran {len(seeds)} jobs and routed none to the joined replica")


def test_a_joined_replica_on_another_box_serves_the_heads_jobs_and_recovers(data_dir: Path,  # noqa: F811
                                                                              network: Network) -> None:
    net = network
    port = probe.free_port()
    head_seen: list[Status] = []
    join_seen: list[Status] = []
    head_cfg = _config(data_dir / "head", head_stall_timeout_s=STALL_S, replica_registration_host=net.head_ip)
    join_cfg = _config(data_dir / "join")
    head = Supervisor(LaunchSpec(TI2V, gpus=(0,), host=net.head_ip), head_cfg,
                      role=HeadRole.from_config(port, head_cfg))
    join_role = JoinRole.from_config(f"{net.head_ip}:{port}", join_cfg)
    join = Supervisor(LaunchSpec(TI2V, gpus=(0,)), join_cfg, api_key=False, role=join_role)
    pgids: list[int] = []
    try:
        head.start(on_status=head_seen.append, timeout=START_S)
        assert f"accepting replicas on {net.head_ip}:{port}" in head.status().text
        argv = " ".join(head._run.argv)                                                       # noqa: SLF001
        assert f"--omni-master-address {net.head_ip} --omni-master-port {port}" in argv

        if net.boxes:   # -- a firewall refuses the registration port: serve --join refuses before starting
            net.boxes.block([port])
            with pytest.raises(LauncherError) as refused:
                net.on_replica(join_role.reachable)
            assert refused.value.what == f"The head at {net.head_ip}:{port} is not reachable (unreachable)"
            net.boxes.unblock()
        net.on_replica(join_role.reachable)

        net.on_replica(join.start, on_status=join_seen.append, timeout=START_S)
        assert join.status().text.startswith("Ready: 1 replica of " + TI2V), join.status().text
        assert "--headless" in join._run.argv and "--port" not in join._run.argv              # noqa: SLF001
        wait_for(lambda: "attached remote replica" in _log(head), 60, "the head to attach the joined replica")
        pgids += [head.pgid, join.pgid]
        if net.boxes:   # -- registered from the replica box, connected to the head's own per-replica ports
            assert f"registered from host {net.replica_ip}" in _log(head)
            wait_for(lambda: _head_ports_in_use(join, net.head_ip) - {port}, 30,
                     "the joined runtime's connections to the head's per-replica ports")

        # -- routed: the head sends jobs to the joined replica, whose own process runs them
        ran = _joined_replica_runs_one(head, join, seeds=(1, 2, 3, 4, 5, 6), after_run_id=None)
        assert ran.done and ran.total == 3                            # its steps, in the joined runtime's log

        if net.boxes:   # -- the replica box's cable pulled while it runs a job: nothing restarts
            boxes = net.boxes

            def pull_cable(progress: DenoiseProgress) -> None:
                """Out from mid-denoise until the replica finished its job offline (about 8 s, far below
                the 30 s heartbeat and the 120 s head probe): its frames wait for the link."""
                boxes.cut()
                try:
                    assert net.on_replica(probe_tcp, net.head_ip, port) == "unreachable"
                    wait_for(lambda: (lambda p: p and p.run_id == progress.run_id and p.done)(join.progress()),
                             LONG_STEPS * STEP_S * 4 + 30, "the joined replica to finish its job offline")
                finally:
                    boxes.mend()
            cut = _joined_replica_runs_one(head, join, seeds=(31, 32, 33, 34, 35, 36), after_run_id=ran.run_id,
                                           steps=LONG_STEPS, while_running=pull_cable)
            assert cut.done and cut.total == LONG_STEPS
            assert head.generation == 1 and join.generation == 1
            ran = cut

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
