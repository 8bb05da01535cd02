"""The numeric request fields, declared once: each one's setting name, upstream form field, the range
the launcher sends and the range vLLM-Omni 0.30 takes (entrypoints/openai/protocol/videos.py).

Every surface derives its bounds from these records, so a range is changed in one place: the Generate
Video, Generate Batch and pipeline nodes' widgets (min and max), the command line's checks
(cli/request_options.py), the core's range check (models.request_for) and the fix the launcher gives
when the server refuses a value anyway (http_errors.FIELD_LIMITS). They live in client/ because the
request (request.py) and its error text are here, and client/ may not import models/.

The launcher's range is upstream's where upstream bounds a field (steps 1..200, guidance 0..20,
boundary 0..1, fps at least 1) and narrower where upstream takes any int64: a size, frame count or
frame rate far beyond what Wan makes would only fail late on the GPU, and a seed is one of the
nodes' non-negative 63-bit seeds (upstream takes negative ones too). flow_shift has no upstream
bound; 50 is the widget's own. The nodes' "model's value" markers (0, or -1 where 0 is a real
value) sit below `low` and are the nodes' only: on the command line a value is used as given.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

INT64_MAX = 2**63 - 1
INT64_MIN = -(2**63)


@dataclass(frozen=True)
class RequestField:
    """One numeric request field and the range every surface takes for it."""

    name: str                 # the setting: the node widget, request_for's keyword, the CLI's --name
    attribute: str            # VideoRequest's field
    form: str                 # upstream's form field
    kind: type                # int or float
    low: float                # the smallest value the launcher sends
    high: float               # the largest value the launcher sends
    upstream: tuple[Optional[float], Optional[float]]   # vLLM-Omni 0.30's range (None: unbounded)
    what: str                 # what it is, for error text
    example: str              # a typical value, for a fix ("--steps 40")
    marker: Optional[float] = None   # the nodes' "model's value" (0 or -1); None: none (the seed)
    rule: str = ""            # what else a value must be (models.check_request checks it)

    def shown(self, value: float) -> str:
        """A value as error text shows it: a whole number in full (a seed is 19 digits), else :g."""
        return str(int(value)) if self.kind is int or float(value).is_integer() else f"{value:g}"

    @property
    def range_text(self) -> str:
        """'1..200': the launcher's range, as a fix says it."""
        return f"{self.shown(self.low)}..{self.shown(self.high)}"

    def widget(self, high: Optional[float] = None, **opts: Any) -> dict[str, Any]:
        """A node widget's min and max: the marker (else `low`) up to `high` (a node's own narrower
        maximum, else the field's), in the widget's type, plus `opts` (step, ...)."""
        low = self.low if self.marker is None else self.marker
        top = self.high if high is None else high
        return {"min": self.kind(low), "max": self.kind(top), **opts}

    def refusal(self, value: float) -> Optional[str]:
        """None when `value` is in range, else the bound it breaks ('at most 200')."""
        if value < self.low:
            return f"at least {self.shown(self.low)}"
        if value > self.high:
            return f"at most {self.shown(self.high)}"
        return None


_SIZE_RULE = "a multiple of 16 (32 for TI2V-5B)"
REQUEST_FIELDS: dict[str, RequestField] = {f.name: f for f in (
    RequestField("width", "width", "width", int, 1, 4096, (1, INT64_MAX), "the frame width in pixels", "1280",
                 marker=0, rule=_SIZE_RULE),
    RequestField("height", "height", "height", int, 1, 4096, (1, INT64_MAX), "the frame height in pixels", "704",
                 marker=0, rule=_SIZE_RULE),
    RequestField("frames", "num_frames", "num_frames", int, 1, 1025, (1, INT64_MAX), "the frame count (4k+1)",
                 "81", marker=0, rule="4k+1 for Wan (e.g. 81)"),
    RequestField("fps", "fps", "fps", float, 1, 120, (1, INT64_MAX), "frames per second", "24", marker=0),
    RequestField("steps", "steps", "num_inference_steps", int, 1, 200, (1, 200), "the number of denoise steps",
                 "40", marker=0),
    RequestField("guidance", "guidance", "guidance_scale", float, 0, 20, (0, 20), "the guidance scale", "5",
                 marker=-1),
    RequestField("guidance_2", "guidance_2", "guidance_scale_2", float, 0, 20, (0, 20),
                 "the low-noise expert's guidance scale", "3", marker=-1),
    RequestField("boundary_ratio", "boundary_ratio", "boundary_ratio", float, 0, 1, (0, 1),
                 "the A14B expert boundary", "0.875", marker=-1),
    RequestField("flow_shift", "flow_shift", "flow_shift", float, 0, 50, (None, None), "the flow shift", "5",
                 marker=-1),
    RequestField("seed", "seed", "seed", int, 0, INT64_MAX, (INT64_MIN, INT64_MAX), "the noise seed", "42"),
)}
SEED = REQUEST_FIELDS["seed"]
