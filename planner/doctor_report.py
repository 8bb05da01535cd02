"""The doctor's findings: one `Check` per thing looked at, and the `DoctorReport` that prints them.

Shared by the machine checks (planner/doctor.py) and the server-environment checks
(planner/doctor_env.py, also used by `setup`), so both speak the same four statuses.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from .gpus import GpuInfo

OK, WARNING, PROBLEM, UNCHECKED = "ok", "warning", "problem", "unchecked"
VERDICT_NAMES = 24      # characters of check names the verdict line lists (the Doctor node shows ~40)


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


# What the box is for, from its GPUs (planner/doctor.py decides): the verdict's second half.
GPU_BOX, CLIENT_ONLY, GPUS_UNKNOWN = "gpu_box", "client_only", "gpus_unknown"
_ORDER = {PROBLEM: 0, WARNING: 1, UNCHECKED: 2, OK: 3}


@dataclass
class DoctorReport:
    checks: list[Check]
    gpus: list[GpuInfo] = field(default_factory=list)
    peers: list[dict[str, Any]] = field(default_factory=list)
    server_env: dict[str, Any] = field(default_factory=dict)
    role: str = GPUS_UNKNOWN           # GPU_BOX, CLIENT_ONLY or GPUS_UNKNOWN
    gpu_source: str = ""               # where `gpus` came from when not NVML (the GPU-memory variable)

    @property
    def problems(self) -> list[Check]:
        return [c for c in self.checks if c.status == PROBLEM]

    @property
    def warnings(self) -> list[Check]:
        return [c for c in self.checks if c.status == WARNING]

    @property
    def unchecked(self) -> list[Check]:
        return [c for c in self.checks if c.status == UNCHECKED]

    @property
    def ok(self) -> bool:
        return not self.problems

    def check(self, name: str) -> Check:
        return next(c for c in self.checks if c.name == name)

    def box(self) -> str:
        """What this machine can do, in a sentence."""
        if self.role == CLIENT_ONLY:
            return ("client-only box: no NVIDIA GPU, so it cannot run a local server; use a server on a GPU machine "
                    "(Remote Server node, or `generate --url URL`)")
        if self.role == GPU_BOX:
            source = f" ({self.gpu_source})" if self.gpu_source else ""
            return f"GPU box: {len(self.gpus)} GPU(s){source}, it can run a local server"
        return "GPUs unknown: NVML could not tell whether this box has any"

    def verdict(self) -> str:
        """The report's head: a first line short enough for the Doctor node at its default size (two
        lines of about 20 characters show: "FAIL: 1 problem (server_env)"), then what the box is,
        then the first fix."""
        def named(checks: list[Check], word: str, names: bool) -> str:
            counted, listed = f"{len(checks)} {word}{'s' if len(checks) != 1 else ''}", ", ".join(c.name for c in checks)
            return f"{counted} ({listed})" if names and len(listed) <= VERDICT_NAMES else counted
        # The problems, or where there is none the warnings: one short line the node shows whole (the
        # report's last line counts both).
        if self.problems:
            head = f"FAIL: {named(self.problems, 'problem', True)}"
        else:
            head = f"OK: {named(self.warnings, 'warning', True) if self.warnings else 'no problems'}"
        text = f"{head}\n{self.box()[0].upper()}{self.box()[1:]}."
        first = self.problems[0] if self.problems else None
        return text + (f"\nFirst fix, {first.name}: {first.fix}" if first is not None and first.fix else "")

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "verdict": self.verdict(), "role": self.role, "gpu_source": self.gpu_source or "NVML",
                "checks": [c.to_dict() for c in self.checks],
                "gpus": [g.to_dict() for g in self.gpus], "peers": self.peers, "server_env": self.server_env,
                "problems": len(self.problems), "warnings": len(self.warnings),
                "unchecked": [c.name for c in self.unchecked]}

    def text(self) -> str:
        """The verdict first, then the checks worst first (problems, warnings, unchecked, ok), then the counts."""
        mark = {OK: "ok  ", WARNING: "WARN", PROBLEM: "FAIL", UNCHECKED: "--  "}
        lines = [self.verdict()]
        for c in sorted(self.checks, key=lambda c: _ORDER.get(c.status, 4)):
            lines.append(f"[{mark.get(c.status, c.status)}] {c.name}: {c.summary}")
            if c.fix:
                lines.append(f"       fix: {c.fix}")
        n_prob, n_warn, n_un = len(self.problems), len(self.warnings), len(self.unchecked)
        lines.append(f"{n_prob} problem(s), {n_warn} warning(s), {n_un} check(s) could not run" +
                     (f" ({', '.join(c.name for c in self.unchecked)})" if n_un else ""))
        return "\n".join(lines)
