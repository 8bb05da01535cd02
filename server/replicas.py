"""N replicas of one parallel layout in one `vllm serve` process: the flag, the checks, the watch.

vLLM-Omni (0.26 and 0.30, the "single runtime" form) serves several copies of stage 0 from
one API process when the stage config says `num_replicas`: the orchestrator spawns one
`StageDiffusionProc` per replica (multiprocessing "spawn", children of the server process,
so in its process group) and sends each job to one of them, round-robin over the live ones.
The launcher writes no balancer; it only asks for the replicas and watches them.

How they are asked for (checked against the real 0.30 parser and config resolution by
tests/contract/test_replicas_supervised.py; 0.26 read in its source: the same
`parse_stage_overrides` -> `stage_0_num_replicas` -> `compute_replica_layout` path):

    --stage-overrides '{"0": {"num_replicas": N, "devices": "0,1,...,N*M-1"}}'

`devices` are logical indices into the server's CUDA_VISIBLE_DEVICES ("pool mode": N*M
entries, replica r gets entries r*M .. r*M+M-1, M = the layout's world size). Without
`devices` every replica would inherit all visible GPUs and share GPU 0.

What upstream does not do (docs/replicas.md): it never restarts a dead replica, and
`/health` stays 200 while the survivors serve, so the server quietly loses capacity.
`ReplicaWatch` therefore records the replica processes once the server is ready and tells
the supervisor when one of them is gone; the supervisor restarts the whole group.

I2V-A14B: upstream ignores `num_replicas` from `--stage-overrides` (and from a deploy YAML)
for it, because its pipeline class has no entry in upstream's pipeline registry; the
replicas would silently be one. It is refused with the alternatives.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Optional, Sequence

import psutil

from ..errors import SpecError
from ..models import WanFamily
from . import failures
from .failures import ServerFailure

# model_index.json classes that upstream's pipeline registry maps to a stage config (wan2_2_ti2v),
# the only Wan models whose stage config `num_replicas` reaches.
REPLICABLE_PIPELINES = ("WanPipeline",)
MAX_REPLICAS = 8

# A child of the server that is not a replica: multiprocessing's resource tracker.
_NOT_A_REPLICA = ("multiprocessing.resource_tracker",)


def stage_overrides(replicas: int, world_size: int) -> list[str]:
    """The flag pair that asks for `replicas` copies of a `world_size`-GPU layout ([] for one)."""
    if replicas <= 1:
        return []
    value = json.dumps({"0": {"num_replicas": replicas, "devices": device_pool(replicas, world_size)}},
                       separators=(",", ":"))
    return ["--stage-overrides", value]


def runtime_replica_flags(replicas: int, world_size: int) -> list[str]:
    """The same replicas for a head or headless runtime (`--stage-id`), where upstream takes the count
    from `--omni-dp-size-local` (a `num_replicas` would be overwritten) and splits the same pool."""
    if replicas <= 1:
        return []
    value = json.dumps({"0": {"devices": device_pool(replicas, world_size)}}, separators=(",", ":"))
    return ["--omni-dp-size-local", str(replicas), "--stage-overrides", value]


def device_pool(replicas: int, world_size: int) -> str:
    """Every replica's logical GPUs, in order: upstream gives replica r entries r*M .. r*M+M-1."""
    return ",".join(str(i) for i in range(replicas * world_size))


def check(replicas: int, family: WanFamily) -> None:
    """Refuse a replica count upstream cannot serve as asked (GPU counts are the spec's check)."""
    if not 1 <= replicas <= MAX_REPLICAS:
        raise SpecError(f"Replicas {replicas} is out of range", f"replicas must be 1..{MAX_REPLICAS}",
                        "set replicas to 1 (one server on its GPUs) or to the number of copies you want",
                        setting="replicas")
    if replicas > 1 and family.pipeline_class not in REPLICABLE_PIPELINES:
        raise SpecError(
            f"{family.label} cannot be served as {replicas} replicas",
            f"vLLM-Omni ignores num_replicas for {family.pipeline_class} (it has no entry in upstream's "
            "pipeline registry, so the stage override is never applied): the server would run one replica "
            "and leave the other GPUs idle",
            "set replicas to 1 and use the GPUs for one faster video (parallel mode cfg 2 on two GPUs), or "
            "serve T2V-A14B or TI2V-5B as replicas", setting="replicas")


@dataclass(frozen=True)
class Replica:
    """One replica process: its index (start order, as upstream numbers them) and identity."""

    index: int
    pid: int
    create_time: float

    def alive(self) -> bool:
        try:
            proc = psutil.Process(self.pid)
            return proc.status() != psutil.STATUS_ZOMBIE and abs(proc.create_time() - self.create_time) < 0.05
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            return False


class ReplicaWatch:
    """The replica processes of one ready server, and which of them is gone."""

    def __init__(self, replicas: list[Replica], expected: int) -> None:
        self.replicas = replicas
        self.expected = expected

    @classmethod
    def find(cls, server_pid: Optional[int], expected: int) -> "ReplicaWatch":
        """The server's replica processes: its direct children (spawned or forked, as vLLM's
        VLLM_WORKER_MULTIPROC_METHOD decides), oldest first, without the resource tracker.

        Upstream starts the replicas one after the other during startup and answers /health
        only once all of them are initialized, so at ready time they are the oldest children
        (a helper started later is younger and is not counted). A replica's own GPU workers
        are its children, not the server's."""
        if expected <= 1 or server_pid is None:
            return cls([], expected)
        try:
            children = psutil.Process(server_pid).children()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            return cls([], expected)
        found: list[tuple[float, int]] = []
        for child in children:
            try:
                argv = " ".join(child.cmdline())
                if child.status() != psutil.STATUS_ZOMBIE and not any(word in argv for word in _NOT_A_REPLICA):
                    found.append((child.create_time(), child.pid))
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        found.sort()
        return cls([Replica(i, pid, t) for i, (t, pid) in enumerate(found[:expected])], expected)

    @property
    def complete(self) -> bool:
        """Every expected replica process was found (one replica is the server itself: nothing to find)."""
        return self.expected <= 1 or len(self.replicas) == self.expected

    def pids(self) -> list[int]:
        return [r.pid for r in self.replicas]

    def dead(self) -> Optional[Replica]:
        """The first recorded replica that no longer runs (None: all alive)."""
        return next((r for r in self.replicas if not r.alive()), None)


def replica_died(replica: Replica, count: int, tail: Sequence[str]) -> ServerFailure:
    """The failure a dead replica is: the server runs on, short of one replica, until restarted."""
    return ServerFailure(
        failures.CRASH, f"Replica {replica.index} of {count} (pid {replica.pid}) died",
        "vLLM-Omni does not restart a dead replica: its job fails, the others keep serving and /health "
        f"stays 200, so the server would quietly run on {count - 1} of {count} replicas",
        "nothing, the launcher restarts the server with all replicas; if it keeps dying, the log names the "
        "cause (out of memory: lower the request or set offload; or set replicas to 1)",
        setting="replicas", raw="\n".join(tail))


def missing_note(watch: ReplicaWatch) -> str:
    """A warning for a server whose replica processes could not all be identified."""
    return (f"Found {len(watch.replicas)} of {watch.expected} replica processes of the server; a replica "
            "that dies may go unnoticed (vLLM-Omni does not restart it and /health stays 200)")
