"""One Wan2.2 generation request as vLLM-Omni's multipart form, and what its answer may be.

Upstream facts (checked against the 0.30 wheel): `POST /v1/videos` takes multipart/form-data;
`num_frames` and `fps` are always sent (omitting them gives a 1-frame clip at 24 fps); `model`
is never sent (a mismatch is a 400 and the server knows its model); 0.26 takes `fps` as an int,
0.30 as a float >= 1.

Per-request extras (both 0.26 and 0.30): `lora` is one JSON object `{"name", "path", "scale"}`
naming a PEFT folder on the server's disk (`entrypoints/openai/utils.py: parse_lora_request`;
name and path are required, the int id defaults to a hash of the path); `extra_params` is a
JSON object whose `sample_solver` ("unipc" default, "euler") Wan reads per request
(`pipeline_wan2_2.py: resolve_wan_sample_solver`); RIFE frame interpolation is four flat fields
and turns F frames into (F-1)*2**exp+1 at fps*2**exp (`postprocess/rife_interpolator.py`).

The worker-side MP4 (0.30 only): `extra_params.preencode_mp4 = true` makes the Wan pipelines decode the
VAE in chunks straight into the MP4 encoder (`diffusion/models/wan2_2/chunked_mp4.py:41-58`,
`resolve_wan_preencode_mp4`), so the serving layer's postprocess and one-shot encode are skipped (same
codec: H.264 yuv420p, crf 18, preset ultrafast, `media_utils.py:248-268`). It refuses frame interpolation
and any output_type but "np" (ValueError, chunked_mp4.py:51-57) and encodes at int(fps)
(`resolve_wan_output_fps`, chunked_mp4.py:77-87), while the serving layer's own encode keeps a fractional
rate. 0.26 merges the key into extra_args and nothing reads it (its serving_video.py:197-204).
Which request carries it is server/launch/worker_mp4.py's decision; `worker_mp4_blocker` below is the
request's own part of it.
"""
from __future__ import annotations

import dataclasses
import json
import math
import numbers
from dataclasses import dataclass, field
from typing import Any, Optional

from ..errors import LauncherError
from .bounds import ClipBounds, bounds_for
from .media import AudioClip, ControlVideo, ReferenceImage, reference_images_value
from .request_fields import REQUEST_FIELDS


SAMPLERS = ("unipc", "euler")
DEFAULT_SAMPLER = "unipc"


@dataclass(frozen=True)
class RequestLora:
    """One per-request LoRA: a PEFT folder (adapter_config.json + adapter_model.safetensors) as
    the *server* sees it, and its strength. vLLM-Omni takes one adapter per request."""

    name: str
    path: str
    scale: float = 1.0

    def form_value(self) -> str:
        """The `lora` form field exactly as upstream's parser reads it."""
        return json.dumps({"name": self.name, "path": self.path, "scale": _real(self.scale, "lora strength")},
                          allow_nan=False)


@dataclass(frozen=True)
class FrameInterpolation:
    """RIFE post-interpolation: 2**exp times the frames (minus the seams) and the fps.
    `model_path` is a folder holding flownet.pkl on the server's disk; the launcher never lets
    the server download one (upstream's default is a Hugging Face repo)."""

    model_path: str
    exp: int = 1
    scale: float = 1.0

    @property
    def multiplier(self) -> int:
        return 2 ** int(self.exp)

    def form_fields(self) -> dict[str, str]:
        if int(self.exp) < 1 or not float(self.scale) > 0:
            raise LauncherError(
                f"Frame interpolation exp {self.exp} / scale {self.scale} is not valid",
                "vLLM-Omni needs exp >= 1 (1 doubles the frames, 2 quadruples them) and a scale above 0",
                "set interpolation_exp to 1 or 2 and interpolation_scale to 1.0 (0.5 for large clips)",
                setting="interpolation_exp")
        return {"enable_frame_interpolation": "true", "frame_interpolation_exp": str(int(self.exp)),
                "frame_interpolation_scale": _form_text(float(self.scale)),
                "frame_interpolation_model_path": self.model_path}


@dataclass
class VideoRequest:
    """One Wan2.2 generation. None means "let the server decide" and is not sent.

    `num_frames` and `fps` are always sent. `image_png` (PNG bytes, see images.image_to_png)
    is uploaded as `input_reference` for I2V / TI2V. `lora` is the request's one PEFT adapter;
    `sampler` ("unipc" / "euler"; None or "unipc", upstream's default, sends nothing) goes out
    as extra_params.sample_solver; `interpolation` turns on RIFE. `extra` holds further raw
    form fields for advanced use; it may not carry `model`, and its `extra_params` JSON object
    is merged with the sampler's and the worker-side MP4's (`preencode`).
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
    lora: Optional[RequestLora] = None
    sampler: Optional[str] = None
    interpolation: Optional[FrameInterpolation] = None
    # VACE / speech-to-video media (media.py; docs/wan-pipelines.md): one control video or up to
    # four reference images, never both (upstream answers 400); audio for S2V. `output_frames`:
    # the (fewest, most) frames the clip may have when the model decides its length (S2V: the audio).
    control_video: Optional[ControlVideo] = None
    reference_images: tuple[ReferenceImage, ...] = ()
    audio: Optional[AudioClip] = None
    output_frames: Optional[tuple[int, int]] = None
    # The worker-side MP4 (extra_params.preencode_mp4; see the module docstring): True sends it, False
    # never; None is undecided and sends nothing: server/launch/worker_mp4.py decides it for a server the
    # launcher started (the bench sets it outright to compare both paths).
    preencode: Optional[bool] = None

    def __post_init__(self) -> None:
        """Numbers are numbers: NaN, inf, text or a list in a numeric field is refused here, before
        it can size anything (bounds.py) or reach the form as "nan"."""
        for name, setting in _WHOLE_FIELDS.items():
            _whole(getattr(self, name), setting)
        for name, setting in _REAL_FIELDS.items():
            _real(getattr(self, name), setting)

    def form_fields(self, server_version: tuple[int, int] = (0, 30)) -> dict[str, Any]:
        """The multipart form: str values are text fields; `input_reference` is a
        (filename, bytes, content type) file part. Raises LauncherError for values the
        server version cannot take."""
        fps = _check_fps(self.fps, server_version)
        frames = _whole(self.num_frames, "frames")
        if frames is None or frames < 1:
            raise LauncherError(
                f"frames {self.num_frames} is not valid",
                "a video needs at least one frame, and the launcher always sends the frame count "
                "(without it vLLM-Omni makes a 1-frame clip)",
                "set frames to 4k+1, e.g. 81", setting="frames")
        values: dict[str, Any] = {
            "prompt": self.prompt,
            "negative_prompt": self.negative_prompt,
            "width": _whole(self.width, "width"),
            "height": _whole(self.height, "height"),
            "num_frames": frames,
            "fps": fps,
            "num_inference_steps": _whole(self.steps, "steps"),
            "guidance_scale": _real(self.guidance, "guidance"),
            "guidance_scale_2": _real(self.guidance_2, "guidance_2"),
            "boundary_ratio": _real(self.boundary_ratio, "boundary_ratio"),
            "flow_shift": _real(self.flow_shift, "flow_shift"),
            "seed": _whole(self.seed, "seed"),
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
        if self.preencode:
            blocker = self.worker_mp4_blocker(server_version)
            if blocker is not None:
                raise LauncherError("The worker-side MP4 (preencode_mp4) cannot serve this request",
                                    blocker, "send the request without preencode_mp4", setting="extra")
        own = {"sample_solver": None if self.sampler in (None, DEFAULT_SAMPLER) else self.sampler,
               "preencode_mp4": None if self.preencode is None else bool(self.preencode)}
        extra_params = _extra_params(form.get("extra_params"), self.sampler, own)
        if extra_params is not None:
            form["extra_params"] = extra_params
        if self.lora is not None:
            form["lora"] = self.lora.form_value()
        if self.interpolation is not None:
            form.update(self.interpolation.form_fields())
        if self.image_png is not None:
            form["input_reference"] = ("image.png", bytes(self.image_png), "image/png")
        form.update(self._media_fields(server_version))
        return form

    def worker_mp4_blocker(self, server_version: tuple[int, int]) -> Optional[str]:
        """Why this request cannot take the worker-side MP4 on a server of `server_version` (None: it can):
        the server is before 0.30, it interpolates frames or asks for another output_type (upstream raises
        ValueError), or its fps is fractional (the worker would encode int(fps): another rate than the
        serving layer's own encode and the response's metadata)."""
        raw = {key for key in self.extra if self.extra[key] is not None}
        if tuple(server_version)[:2] < (0, 30):
            return f"vLLM-Omni {'.'.join(map(str, tuple(server_version)[:2]))} has no worker-side MP4 (0.30 added it)"
        if self.interpolation is not None or "enable_frame_interpolation" in raw:
            return "frame interpolation needs the decoded frames, which the worker-side MP4 never materializes"
        if "output_type" in raw:
            return "the worker-side MP4 only serves the default output_type"
        try:
            fractional = not float(self.fps).is_integer()
        except (TypeError, ValueError):
            fractional = True
        if fractional:
            return f"the worker encodes whole frame rates only (fps {self.fps} would become {int(self.fps)})"
        return None

    def raw_extra_params(self) -> dict[str, Any]:
        """The raw `extra_params` field's object ({} without one, or where it is no JSON object:
        form_fields refuses that)."""
        try:
            params = json.loads(self.extra.get("extra_params") or "{}")
        except (TypeError, ValueError):
            return {}
        return params if isinstance(params, dict) else {}

    def _media_fields(self, server_version: tuple[int, int]) -> dict[str, Any]:
        """The VACE / S2V media parts (docs/wan-pipelines.md, section 2): a control video or one
        reference as the `input_reference` file, several references as the `image_reference` list
        (0.30 only), audio as the `audio_reference` data URL."""
        refs, out = tuple(self.reference_images), {}
        used = [name for name, on in (("image", self.image_png is not None), ("control_video", self.control_video),
                                      ("reference_images", refs)) if on]
        if len(used) > 1:
            raise LauncherError(
                f"The request has both {used[0]} and {used[1]}",
                "vLLM-Omni takes one image or one video per request for Wan (it answers 400 'does not support "
                "mixed image and video references')", f"disconnect {used[1]} or {used[0]}", setting=used[1])
        if self.control_video is not None:
            out["input_reference"] = ("control.mp4", self.control_video.mp4, "video/mp4")
        if len(refs) == 1:
            out["input_reference"] = ("reference.jpg", refs[0].jpeg, "image/jpeg")
        elif refs:
            if tuple(server_version) < (0, 30):
                raise LauncherError(
                    f"{len(refs)} reference images need vLLM-Omni 0.30",
                    "0.26 takes a single image reference per request",
                    "pass one reference image, or use a 0.30 server", setting="reference_images")
            out["image_reference"] = reference_images_value(refs)
        if self.audio is not None:
            out["audio_reference"] = self.audio.form_value()
        return out

    def bounds(self, frame_multiplier: int = 1) -> ClipBounds:
        """What the server's clip for this request may be (size, frames, bytes); see bounds.py.
        `frame_multiplier`: the frame interpolation factor when raw `extra` fields turn it on;
        with `interpolation` set, exactly its multiplier applies."""
        if self.interpolation is not None:
            frame_multiplier = self.interpolation.multiplier
        bounds = bounds_for(self.width, self.height, self.num_frames, self.extra, frame_multiplier)
        if self.output_frames is not None:
            fewest, most = (int(n) for n in self.output_frames)
            bounds = dataclasses.replace(bounds, min_frames=fewest, max_frames=most,
                                         asked=f"{self.width or '?'}x{self.height or '?'}x{fewest}..{most}")
        return bounds


def _extra_params(raw: Optional[str], sampler: Optional[str], own: dict[str, Any]) -> Optional[str]:
    """The extra_params JSON: the raw field's object plus the request's own keys (`own`: sample_solver for a
    non-default sampler, preencode_mp4 once decided). None is not sent, and neither is False (upstream's
    default, said by sending nothing); a raw key that says otherwise than the request is refused."""
    if sampler is not None and sampler not in SAMPLERS:
        raise LauncherError(
            f"Sampler {sampler!r} is not known",
            f"Wan2.2 on vLLM-Omni has the samplers {', '.join(SAMPLERS)}",
            "pick unipc (the default) or euler (for 4-step distill LoRAs)", setting="sampler")
    own = {key: value for key, value in own.items() if value is not None}
    if not own:
        return raw
    params: Any = {}
    if raw is not None:
        try:
            params = json.loads(raw)
        except ValueError:
            params = None
        if not isinstance(params, dict):
            raise LauncherError(
                "The extra_params field is not a JSON object",
                "vLLM-Omni answers 400 'Invalid JSON in form field.' to anything else",
                'write it as a JSON object, e.g. {"flow_shift": 12}', setting="extra")
    for key, value in own.items():
        if params.get(key, value) != value:
            source, setting = _OWN_SOURCES[key]
            raise LauncherError(
                f"Two values were given for {key}",
                f"{source} says {json.dumps(value)} and extra_params says {json.dumps(params[key])}",
                f"remove {key} from extra_params", setting=setting)
    added = {key: value for key, value in own.items() if value is not False and key not in params}
    return json.dumps({**params, **added}) if added else raw


# The request's own extra_params keys: what sets each one (for a contradiction's text) and its setting.
_OWN_SOURCES = {"sample_solver": ("the sampler input", "sampler"),
                "preencode_mp4": ("the request's worker-side MP4 choice", "extra")}


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


# Numeric fields and the setting (widget / flag) each one comes from.
_WHOLE_FIELDS = {f.attribute: f.name for f in REQUEST_FIELDS.values() if f.kind is int}
_REAL_FIELDS = {f.attribute: f.name for f in REQUEST_FIELDS.values() if f.kind is float}


def _real(value: Any, setting: str) -> Optional[float]:
    """A float field's value (None stays None); NaN, inf, text or a list is refused before sending,
    never sent as "nan"."""
    if value is None:
        return None
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return int(value)                                  # numpy's integers too; never through float
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise LauncherError(f"{setting} {value!r} is not a finite number"[:200],
                            "the server would get it as text such as 'nan' (or the launcher could not send it)",
                            f"set {setting} to a number", setting=setting)
    return float(value)


def _whole(value: Any, setting: str) -> Optional[int]:
    """An integer field's value (None stays None); anything but a whole number is refused."""
    number = _real(value, setting)
    if number is None:
        return None
    if isinstance(number, float) and not number.is_integer():
        raise LauncherError(f"{setting} {value!r} is not a whole number", "the server takes it as an integer",
                            f"set {setting} to a whole number", setting=setting)
    return int(number)


def _form_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return repr(value)  # "4.0": keeps float fields unambiguous
    return str(value)


__all__ = ["DEFAULT_SAMPLER", "FrameInterpolation", "RequestLora", "SAMPLERS", "VideoRequest"]
