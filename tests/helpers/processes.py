"""Whether the processes a test started are gone: a pid, every stub a data dir's logs name, a group.

Every stub server prints `STUB_PID=<pid>` first (tests/contract/stub_vllm_serve.py), in every
process it spawns, into the server log the supervisor keeps under the data dir; a test that ends
a server checks that each of them has exited, waiting on it (bounded), never sleeping a fixed time."""
from __future__ import annotations

import re
from pathlib import Path

import psutil

from stubserver import wait_for
from vllm_omni_launcher.server.process import process_group


def alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def stub_pids(data_dir: Path) -> list[int]:
    """Every STUB_PID a stub printed into any server log under data_dir, oldest log first."""
    pids = []
    for log in sorted((data_dir / "logs").glob("*.log*"), key=lambda p: p.stat().st_mtime_ns):
        pids += [int(p) for p in re.findall(r"STUB_PID=(\d+)", log.read_text(errors="replace"))]
    return pids


def assert_no_process_left(data_dir: Path, pgids: tuple[int, ...] = ()) -> None:
    """Wait (bounded) until every stub process data_dir's logs name, and every group in `pgids`, is gone."""
    pids = stub_pids(data_dir)
    wait_for(lambda: not any(alive(p) for p in pids), 30, f"stub processes {pids} to exit")
    for pgid in pgids:
        wait_for(lambda: not process_group.group_members(pgid), 30, f"process group {pgid} to empty")
