"""What the ladder answers (planner/ladder.py): the rungs it tried and the recommendation.

Kept apart from the walk itself, as memory_plan.py is from memory.py: `text()` is what `plan`,
the Local Server node and `generate` / `serve` print, `to_dict()` the JSON of `plan --json`.
Both say which vLLM-Omni line the estimates were calibrated for. `text()` carries no warning:
each printer gives `warnings` itself, once (`plan` after the text; a launch through
`LaunchPlan.warnings`, which also holds the warnings of the spec and the jobs).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from ..server.launch.flags import Version
from ..server.launch.spec import LaunchSpec
from .calibration import calibration_label
from .gpus import GpuInfo
from .memory_plan import MemoryPlan
from .request_shape import RequestShape


@dataclass
class Rung:
    """One configuration on the ladder, with its estimate."""

    spec: LaunchSpec
    label: str
    speed: str                  # a short, honest speed note
    plan: Optional[MemoryPlan] = None
    fits: Optional[bool] = None
    why_not: str = ""
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, "speed": self.speed, "flags": self.spec.flags(),
                "gpus": list(self.spec.gpus) if self.spec.gpus is not None else None,
                "fits": self.fits, "why_not": self.why_not,
                "peak_gib": None if self.plan is None else round(self.plan.peak_gib, 2),
                "per_gpu_peak_gib": None if self.plan is None else [round(g.peak_gib, 2) for g in self.plan.gpus],
                "warnings": list(self.warnings)}


# The rejected rungs the text names one by one: the last in ladder order, just faster than the pick (when nothing
# fits, the leanest: most offload, tiling, FP8); one line sums up the faster ones. Two GPUs have some forty rungs,
# and a list that long buried the answer in the Local Server node's error and in `plan`.
SHOWN_REJECTED = 6


@dataclass
class Recommendation:
    """The fastest fitting configuration (or None), and why each faster one does not fit."""

    spec: Optional[LaunchSpec]
    request: RequestShape                  # may be smaller than asked (see `reduced`)
    asked: RequestShape
    plan: Optional[MemoryPlan]
    label: str
    reason: str
    rejected: list[Rung]                   # faster rungs that did not fit, in ladder order
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    max_frames: Optional[int] = None       # most frames the chosen spec fits at this size
    gpus: list[GpuInfo] = field(default_factory=list)
    speed: str = ""                        # the chosen rung's expected cost (planner/speed_costs.py)
    server_version: Optional[Version] = None   # the vLLM-Omni line planned for (None: the pinned default)
    way_out: str = ""                      # nothing fits: what FP8 would fit, or that even FP8 does not
    fp8_fits: bool = False                 # ...and FP8 would: `way_out` is a fix, not more of the why

    def __post_init__(self) -> None:   # the rung chosen for a reduced request is not a rejected one
        self.rejected = [r for r in self.rejected if r.spec is not self.spec]

    @property
    def reduced(self) -> bool:
        return self.request != self.asked

    @property
    def calibration(self) -> str:
        """Which vLLM-Omni line's memory and speed figures the estimates use."""
        return calibration_label(self.server_version)

    def to_dict(self) -> dict[str, Any]:
        return {
            "spec": self.spec.to_dict() if self.spec else None,
            "flags": self.spec.flags() if self.spec else None,
            "command": self.command(),
            "label": self.label,
            "request": self.request.to_dict(),
            "asked": self.asked.to_dict(),
            "reduced": self.reduced,
            "reason": self.reason,
            "max_frames": self.max_frames,
            "plan": self.plan.to_dict() if self.plan else None,
            "rejected": [r.to_dict() for r in self.rejected],
            "notes": list(self.notes),
            "warnings": list(self.warnings),
            "gpus": [g.to_dict() for g in self.gpus],
            "speed": self.speed,
            "calibration": self.calibration,
            "way_out": self.way_out,
        }

    def command(self) -> Optional[str]:
        """The recommended launch as a line to paste: `vllm serve MODEL --omni ...` (without `--omni`, vLLM does not
        hand over to vLLM-Omni), rendered as `argv` renders it, less the address and port a launch adds."""
        return self.spec.serve_command(["vllm"]).shell() if self.spec else None

    def text(self) -> str:
        lines = []
        if self.spec is None:
            lines.append(f"No configuration fits: {self.reason}")
            if self.way_out:
                lines.append(f"  {self.way_out}")
        else:
            lines.append(f"Recommended: {self.label}")
            lines.append(f"  {self.command()}")
            lines.append(f"  why: {self.reason}")
            if self.speed:
                lines.append(f"  expected speed: {self.speed}")
            if self.reduced:
                lines.append(f"  request reduced: {self.asked.label()} -> {self.request.label()}")
            if self.max_frames:
                lines.append(f"  at {self.request.width}x{self.request.height} this configuration fits up to "
                             f"{self.max_frames} frames")
        asked = f" at {self.asked.label()}" if self.reduced or self.spec is None else ""   # the request they are for
        hidden = self.rejected[:-SHOWN_REJECTED] if len(self.rejected) > SHOWN_REJECTED else []
        if hidden:
            lines.append(f"  not {len(hidden)} faster configurations ({hidden[0].label} first): none fits "
                         "either (plan --json lists each with its reason)")
        for r in self.rejected[len(hidden):]:
            lines.append(f"  not {r.label}{asked}: {r.why_not}")
        lines.append(f"  estimates calibrated for {self.calibration}")
        for n in self.notes:
            lines.append(f"note: {n}")
        return "\n".join(lines)


FP8_SWITCH = ("Serving Config's fp8 on, with parallel_mode auto; CLI: plan --allow-fp8, or serve / generate "
              "--quantization fp8 with --parallel auto")


def fp8_way_out(planned: Recommendation) -> tuple[str, bool]:
    """The sentence a nothing-fits answer ends with, and whether FP8 fits, from `planned`: the same request
    planned by the same ladder with FP8 allowed. FP8 stays off unless asked (ladder.py), but where nothing else fits the user
    should read the FP8 configuration that would, with its GPU and host RAM figures, and what it costs;
    or that even FP8 does not fit, and why."""
    if planned.spec is None or planned.plan is None:
        tried = [r for r in planned.rejected if r.spec.memory.quantization == "fp8" and r.plan is not None]
        if not tried:
            return "Even FP8 does not fit", False
        leanest = min(tried, key=lambda r: r.plan.peak_gib)   # type: ignore[union-attr]
        return (f"Even FP8 does not fit: its leanest configuration ({leanest.label}) does not: "
                f"{leanest.why_not}", False)
    p = planned.plan
    gpus = ", ".join(f"{g.peak_gib:.1f} GiB of {g.gpu.available_gib:.1f} on GPU {g.gpu.index}"
                     for g in p.gpus if g.gpu is not None)
    host = p.host_ram
    ram = ("" if not host else f", {host['needed_gib']:.0f} GiB host RAM"
           + ("" if host.get("available_gib") is None else f" of {host['available_gib']:.0f}"))
    at = f" at {planned.request.label()} (not {planned.asked.label()})" if planned.reduced else ""
    return (f"With FP8 allowed ({FP8_SWITCH}), {planned.label} fits{at}: {gpus}{ram}. FP8 changes the frames "
            "(they are not bf16's) and upstream has not validated Wan2.2 quantization"), True
