"""What `plan()` (planner/memory.py) answers: named terms per GPU, each GPU's peak and headroom, the verdict.

Kept apart from the estimate itself so the arithmetic in memory.py reads on its own; `text()` is the
report `plan` prints and `to_dict()` its JSON (`--json`).
"""
from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Any, Optional

from ..server.launch.spec import LaunchSpec
from .calibration import calibration_label
from .gpus import GpuInfo
from .model_sizes import ModelSizes
from .request_shape import RequestShape


@dataclass(frozen=True)
class MemoryTerm:
    """One named share of a GPU's peak: `phase` says when it is alive."""

    name: str
    gib: float
    phase: str          # "resident" | "text" | "encode" | "denoise" | "decode" | "outside"
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "gib": round(self.gib, 3), "phase": self.phase, "note": self.note}


@dataclass
class GpuPlan:
    """The estimate for one rank/GPU."""

    rank: int
    gpu: Optional[GpuInfo]
    terms: list[MemoryTerm]
    phases: dict[str, float]          # resident + phase-specific, PyTorch allocator, GiB
    peak_phase: str
    torch_peak_gib: float             # comparable to vLLM-Omni's reported peak (max_memory_reserved)
    outside_gib: float                # CUDA context + NCCL, not in the allocator
    margin_gib: float
    fits: Optional[bool] = None       # None: no GPU known
    headroom_gib: Optional[float] = None

    @property
    def peak_gib(self) -> float:
        """What the GPU must have free: allocator peak + context/NCCL."""
        return self.torch_peak_gib + self.outside_gib

    def to_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "gpu": self.gpu.to_dict() if self.gpu else None,
            "terms": [t.to_dict() for t in self.terms],
            "phases_gib": {k: round(v, 3) for k, v in self.phases.items()},
            "peak_phase": self.peak_phase,
            "torch_peak_gib": round(self.torch_peak_gib, 3),
            "outside_allocator_gib": round(self.outside_gib, 3),
            "peak_gib": round(self.peak_gib, 3),
            "margin_gib": round(self.margin_gib, 3),
            "fits": self.fits,
            "headroom_gib": None if self.headroom_gib is None else round(self.headroom_gib, 3),
        }


@dataclass
class MemoryPlan:
    """Per-GPU estimate for one spec and request, whether it fits, and why."""

    spec: LaunchSpec
    request: RequestShape
    sizes: ModelSizes
    gpus: list[GpuPlan]
    fits: Optional[bool]
    host_ram: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    gpu_source: str = ""
    server_version: Optional[tuple[int, int]] = None     # the vLLM-Omni line calibrated for (None: pinned default)

    @property
    def calibration_text(self) -> str:
        return calibration_label(self.server_version)

    @property
    def peak_gib(self) -> float:
        return max(g.peak_gib for g in self.gpus)

    @property
    def min_headroom_gib(self) -> Optional[float]:
        rooms = [g.headroom_gib for g in self.gpus if g.headroom_gib is not None]
        return min(rooms) if rooms else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "spec": self.spec.to_dict(),
            "flags": self.spec.flags(),
            "request": self.request.to_dict(),
            "tokens": self.request.tokens(self.spec.family),
            "sizes": self.sizes.to_dict(),
            "gpu_source": self.gpu_source,
            "gpus": [g.to_dict() for g in self.gpus],
            "fits": self.fits,
            "peak_gib": round(self.peak_gib, 3),
            "min_headroom_gib": None if self.min_headroom_gib is None else round(self.min_headroom_gib, 3),
            "host_ram": self.host_ram,
            "notes": list(self.notes),
            "calibration": self.calibration_text,
        }

    def text(self) -> str:
        fam = self.spec.family
        lines = [f"{fam.label}  {self.request.label()}  ({self.request.tokens(fam):,} tokens)",
                 f"flags: {shlex.join(self.spec.flags())}",
                 f"sizes: {self.sizes.source}", f"calibrated for: {self.calibration_text}"]
        for g in self.gpus:
            name = f"GPU {g.gpu.index} {g.gpu.name} ({g.gpu.available_gib:.1f} GiB " \
                   f"{'free' if g.gpu.free_gib is not None else 'total'})" if g.gpu else "GPU ?"
            verdict = {True: "fits", False: "DOES NOT FIT", None: "unknown GPU"}[g.fits]
            room = "" if g.headroom_gib is None else f", headroom {g.headroom_gib:+.1f} GiB"
            lines.append(f"rank {g.rank} on {name}: peak {g.peak_gib:.1f} GiB during {g.peak_phase} -> "
                         f"{verdict}{room}")
            for t in g.terms:
                if t.gib >= 0.005:
                    lines.append(f"    {t.name:<34s} {t.gib:7.2f} GiB  [{t.phase}]" + (f"  {t.note}" if t.note else ""))
            lines.append("    " + "  ".join(f"{k}={v:.1f}" for k, v in g.phases.items()) + " GiB (allocator)")
        if self.host_ram:
            h = self.host_ram
            avail = "unknown" if h.get("available_gib") is None else f"{h['available_gib']:.1f} GiB available"
            lines.append(f"host RAM for offload: needs {h['needed_gib']:.1f} GiB, {avail}"
                         + ("" if h.get("ok") is not False else "  -> NOT ENOUGH"))
        for n in self.notes:
            lines.append(f"note: {n}")
        return "\n".join(lines)
