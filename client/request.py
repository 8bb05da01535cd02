"""One Wan2.2 generation request as vLLM-Omni's multipart form, and what its answer may be.

Upstream facts (checked against the 0.30 wheel): `POST /v1/videos` takes multipart/form-data;
`num_frames` and `fps` are always sent (omitting them gives a 1-frame clip at 24 fps); `model`
is never sent (a mismatch is a 400 and the server knows its model); 0.26 takes `fps` as an int,
0.30 as a float >= 1.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Optional

from ..errors import LauncherError
from .bounds import ClipBounds, bounds_for


@dataclass
class VideoRequest:
    """One Wan2.2 generation. None means "let the server decide" and is not sent.

    `num_frames` and `fps` are always sent. `image_png` (PNG bytes, see frames.image_to_png)
    is uploaded as `input_reference` for I2V / TI2V. `extra` holds further raw form fields
    for advanced use (e.g. {"extra_params": '{"sample_solver": "euler"}'}); it may not carry
    `model`.
    """

    prompt: str
    negative_prompt: Optional[str] = None
    width: Optional[int] = None
    height: Optional[int] = None
    num_frames: int = 81
    fps: float = 16.0
    steps: Optional[int] = None
    guidance: Optional[float] = None
    guidance_2: Optional[float] = None
    boundary_ratio: Optional[float] = None
    flow_shift: Optional[float] = None
    seed: Optional[int] = None
    image_png: Optional[bytes] = field(default=None, repr=False)
    extra: dict[str, str] = field(default_factory=dict)

    def form_fields(self, server_version: tuple[int, int] = (0, 30)) -> dict[str, Any]:
        """The multipart form: str values are text fields; `input_reference` is a
        (filename, bytes, content type) file part. Raises LauncherError for values the
        server version cannot take."""
        fps = _check_fps(self.fps, server_version)
        if self.num_frames is None or int(self.num_frames) < 1:
            raise LauncherError(
                f"frames {self.num_frames} is not valid",
                "a video needs at least one frame, and the launcher always sends the frame count "
                "(without it vLLM-Omni makes a 1-frame clip)",
                "set frames to 4k+1, e.g. 81", setting="frames")
        values: dict[str, Any] = {
            "prompt": self.prompt,
            "negative_prompt": self.negative_prompt,
            "width": _int_or_none(self.width),
            "height": _int_or_none(self.height),
            "num_frames": int(self.num_frames),
            "fps": fps,
            "num_inference_steps": _int_or_none(self.steps),
            "guidance_scale": self.guidance,
            "guidance_scale_2": self.guidance_2,
            "boundary_ratio": self.boundary_ratio,
            "flow_shift": self.flow_shift,
            "seed": _int_or_none(self.seed),
        }
        form: dict[str, Any] = {k: _form_text(v) for k, v in values.items() if v is not None}
        for key, value in self.extra.items():
            if key == "model":
                raise LauncherError(
                    "The request may not name the model",
                    "vLLM-Omni answers 400 'Model mismatch' when the form's model differs from the one "
                    "it serves, and it can only run the model it loaded",
                    "remove 'model' from the extra form fields", setting="extra")
            if value is not None:
                form[key] = _form_text(value)
        if self.image_png is not None:
            form["input_reference"] = ("image.png", bytes(self.image_png), "image/png")
        return form

    def bounds(self, frame_multiplier: int = 1) -> ClipBounds:
        """What the server's clip for this request may be (size, frames, bytes); see bounds.py.
        `frame_multiplier`: the frame interpolation factor, when `extra` turns it on."""
        return bounds_for(self.width, self.height, self.num_frames, self.extra, frame_multiplier)


def _check_fps(fps: Any, server_version: tuple[int, int]) -> str:
    try:
        value = float(fps)
    except (TypeError, ValueError):
        value = float("nan")
    if not math.isfinite(value) or value < 1:
        raise LauncherError(
            f"fps {fps} is not valid",
            "vLLM-Omni needs a frame rate of at least 1 (it only sets the MP4's rate; Wan does not use it)",
            "set fps to 16 (A14B models) or 24 (TI2V-5B)", setting="fps")
    if value.is_integer():
        return str(int(value))
    if tuple(server_version) < (0, 30):
        ver = ".".join(str(p) for p in server_version)
        raise LauncherError(
            f"fps {value:g} is not possible with vLLM-Omni {ver}",
            "versions before 0.30 take the frame rate as a whole number",
            f"set fps to {round(value)}, or use vLLM-Omni 0.30 or newer", setting="fps")
    return repr(value)


def _int_or_none(value: Any) -> Optional[int]:
    return None if value is None else int(value)


def _form_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return repr(value)  # "4.0": keeps float fields unambiguous
    return str(value)


__all__ = ["VideoRequest"]
