"""The replica processes of a ready server, and the failure a dead one is.

vLLM-Omni never restarts a dead replica, and `/health` stays 200 while the survivors serve, so
the server would quietly lose capacity (docs/replicas.md). `ReplicaWatch` records the replica
processes once the server is ready (the children upstream spawned, replicas.py says how they are
asked for) and names the first one that is gone; `replica_died` is the failure the supervisor
restarts the whole group for.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import psutil

from ..logs import failures
from ..logs.failures import ServerFailure

# A child of the server that is not a replica: multiprocessing's resource tracker.
_NOT_A_REPLICA = ("multiprocessing.resource_tracker",)


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
