"""The doctor's findings: one `Check` per thing looked at, and the `DoctorReport` that prints them.

Shared by the machine checks (planner/doctor.py) and the server-environment checks
(planner/doctor_env.py, also used by `setup`), so both speak the same four statuses.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from .gpus import GpuInfo

OK, WARNING, PROBLEM, UNCHECKED = "ok", "warning", "problem", "unchecked"


@dataclass
class Check:
    """One finding: status ok / warning / problem / unchecked, and the fix when not ok."""

    name: str
    status: str
    summary: str
    fix: str = ""
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class DoctorReport:
    checks: list[Check]
    gpus: list[GpuInfo] = field(default_factory=list)
    peers: list[dict[str, Any]] = field(default_factory=list)
    server_env: dict[str, Any] = field(default_factory=dict)

    @property
    def problems(self) -> list[Check]:
        return [c for c in self.checks if c.status == PROBLEM]

    @property
    def unchecked(self) -> list[Check]:
        return [c for c in self.checks if c.status == UNCHECKED]

    @property
    def ok(self) -> bool:
        return not self.problems

    def check(self, name: str) -> Check:
        return next(c for c in self.checks if c.name == name)

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "checks": [c.to_dict() for c in self.checks],
                "gpus": [g.to_dict() for g in self.gpus], "peers": self.peers, "server_env": self.server_env,
                "problems": len(self.problems), "unchecked": [c.name for c in self.unchecked]}

    def text(self) -> str:
        mark = {OK: "ok  ", WARNING: "WARN", PROBLEM: "FAIL", UNCHECKED: "--  "}
        lines = []
        for c in self.checks:
            lines.append(f"[{mark.get(c.status, c.status)}] {c.name}: {c.summary}")
            if c.fix:
                lines.append(f"       fix: {c.fix}")
        n_prob, n_un = len(self.problems), len(self.unchecked)
        lines.append(f"{n_prob} problem(s), {n_un} check(s) could not run" +
                     (f" ({', '.join(c.name for c in self.unchecked)})" if n_un else ""))
        return "\n".join(lines)
