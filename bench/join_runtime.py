"""One supervised role of the head + joined-replica bench (bench/gpu_join.py), as the bench records it.

A role's Supervisor says only what runs now; the bench needs its whole history: every status it reported
(with its time), every generation's log (read while it exists: old logs get pruned) and every process of
every generation (the stop check and the NVML split per runtime need them after the restarts).
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Optional

import gpu_replicas

from vllm_omni_launcher.server.supervision.status import Status
from vllm_omni_launcher.server.supervision.supervisor import Supervisor


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
