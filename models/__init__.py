"""The rules a Wan request must meet and the one place its defaults are filled in.

Upstream vLLM-Omni silently rewrites bad request values (frames to 4k+1, sizes floored) or
fails the job late (I2V sizes, missing media). We keep the rules here, once, so the spec, the
planner, the client and the nodes agree and can tell the user the nearest valid value before
a GPU minute is spent. The families themselves (identity, shape, defaults, local folders) are
models/families.py's, which inputs each takes models/inputs.py's, and the numeric fields' ranges
client/request_fields.py's; they are re-exported here so callers import the model layer from one place.
"""
from __future__ import annotations

import math
import numbers
from typing import TYPE_CHECKING, Any, Optional, Sequence

from ..client.request_fields import REQUEST_FIELDS, SEED, RequestField
from ..errors import LauncherError
from .families import (ALL_FAMILIES, FAMILIES, LOCAL_PREFIX, PIPELINE_FAMILIES, LocalModel, WanFamily,
                       family_for, family_of_folder, find_local_models, is_s2v_original)
from .inputs import NODE_WORDS, InputWords, check_inputs, inputs_taken

if TYPE_CHECKING:
    from ..client.media import AudioClip, ControlVideo
    from ..client.request import VideoRequest

__all__ = ["ALL_FAMILIES", "FAMILIES", "LOCAL_PREFIX", "NODE_WORDS", "PIPELINE_FAMILIES", "REQUEST_FIELDS",
           "S2V_FRAMES_PER_CLIP_MAX", "SEED", "InputWords", "LocalModel", "RequestField", "WanFamily", "check_inputs",
           "check_request", "family_for", "family_of_folder", "find_local_models", "guidance_as_sent", "inputs_taken",
           "is_s2v_original", "nearest_frames", "request_for"]


S2V_FRAMES_PER_CLIP_MAX = 120    # per-clip frames (memory grows with them; upstream's default is 80)


def nearest_frames(frames: int) -> int:
    """Nearest valid Wan frame count (4k+1), never below 1."""
    k = max(0, round((frames - 1) / 4))
    return 4 * k + 1


def check_request(family: WanFamily, *, width: int, height: int, frames: int, has_image: bool) -> None:
    """Refuse request shapes upstream would rewrite silently or fail late, naming the fix, and a start
    image the model cannot take or lacks (`has_image`; models/inputs.py's rule)."""
    m = family.size_multiple
    for name, value in (("width", width), ("height", height)):
        if value % m or value <= 0:
            lower, upper = max(m, value // m * m), (value // m + 1) * m
            raise LauncherError(
                f"{name} {value} is not valid for {family.label}",
                f"it must be a multiple of {m} ({'VAE x16 and patch 2' if m == 32 else 'VAE x8 and patch 2'}); "
                "upstream would silently shrink it or fail the job",
                f"set {name} to {lower}" + (f" or {upper}" if upper != lower else ""),
                setting=name,
            )
    if family.pipeline == "s2v":
        _check_s2v_frames(frames)
    elif frames < 1 or (frames - 1) % 4:
        raise LauncherError(
            f"frames {frames} is not valid for Wan2.2",
            "the frame count must be 4k+1 (Wan's VAE packs 4 frames per latent after the first)",
            f"set frames to {nearest_frames(frames)}",
            setting="frames",
        )
    check_inputs(family, ("image",) if has_image else (), known=("image",))


def _check_s2v_frames(frames: int) -> None:
    if frames < 16 or frames > S2V_FRAMES_PER_CLIP_MAX or frames % 4:
        near = min(S2V_FRAMES_PER_CLIP_MAX, max(16, round(frames / 4) * 4))
        raise LauncherError(
            f"frames {frames} is not valid for speech-to-video",
            "for S2V, frames is the length of each clip (the audio decides how many clips); upstream uses 80, "
            f"and the launcher takes multiples of 4 from 16 to {S2V_FRAMES_PER_CLIP_MAX}",
            f"set frames to {near}", setting="frames")


# ----------------------------------------------------------------------------- requests
def _check_number(field: RequestField, value: object) -> None:
    """A request value must be None or a finite number (a whole one for an int field): NaN, inf, text
    and lists would reach the server as "nan" or fail deep inside the launcher."""
    whole = field.kind is int
    if value is None:
        return
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return
    if isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value) \
            and (not whole or float(value).is_integer()):
        return
    name = field.name
    shown = f"the number {value}" if isinstance(value, float) else f"a value of type {type(value).__name__}"
    number = "a whole number" if whole else "a finite number"
    marker = "" if field.marker is None else f" ({field.shown(field.marker)} for the model's recommended value)"
    raise LauncherError(f"{name} is not valid: it is {shown}", f"{name} takes {number}",
                        f"set {name} to {number}{marker}", setting=name)


def _check_ranges(**values: Optional[float]) -> None:
    """Refuse a value the request would send outside its field's range (client/request_fields.py):
    upstream refuses it only after the job is queued, in its own words, and a size or frame count
    beyond the launcher's range would fail late on the GPU."""
    for name, value in values.items():
        field = REQUEST_FIELDS[name]
        broken = None if value is None else field.refusal(value)
        if broken is None:
            continue
        near = field.low if value < field.low else field.high
        whose = "vLLM-Omni's" if near in field.upstream else "the launcher's"
        marker = "" if field.marker is None else \
            f" ({field.shown(field.marker)} on the node for the model's recommended value)"
        raise LauncherError(f"{name} {field.shown(value)} is out of range",
                            f"{name} is {field.what} and must be {broken} ({whose} limit)",
                            f"set {name} to {field.shown(near)}{marker}", setting=name)


def request_for(family: WanFamily, *, prompt: str, negative_prompt: Optional[str] = None,
                width: Optional[int] = None, height: Optional[int] = None, frames: Optional[int] = None,
                fps: Optional[float] = None, steps: Optional[int] = None, guidance: Optional[float] = None,
                guidance_2: Optional[float] = None, boundary_ratio: Optional[float] = None,
                flow_shift: Optional[float] = None, seed: Optional[int] = None,
                image: Any = None, control_video: Optional["ControlVideo"] = None,
                reference_images: Optional[Sequence[Any]] = None, audio: Optional["AudioClip"] = None,
                convert_pictures: bool = True) -> "VideoRequest":
    """The one place request defaults are filled in and checked (nodes and CLI).

    A value left out takes the model's recommended one: None, or the node widgets' markers
    (0 for width, height, frames, fps and steps; any negative number for guidance,
    guidance_2, boundary_ratio and flow_shift, where 0 is a real value). guidance_2 and
    boundary_ratio are sent only to the two-expert A14B models. A step-distilled ("dmd") family
    sends its own steps and guidance (the server runs those whatever is sent; another value is
    refused); flow_shift goes to plain Wan only (VACE, S2V and DMD read the server's --flow-shift).
    VACE takes `control_video` or `reference_images`, S2V `image` plus `audio` (client/media.py).
    The pictures come as given, and this is the one place that decides the size they are sent at:
    `image` is the start image (what client.images.image_to_png takes: ComfyUI IMAGE, [H, W, C] float
    or uint8), `reference_images` the VACE references (an IMAGE batch [N, H, W, C] or a sequence of
    pictures; client.media.reference_pictures). The start image's PNG and the references' JPEGs are made
    here, last, at the width x height resolved here, as the server would stretch them, so a full-size
    photo is never encoded, uploaded nor decoded. Every picture is checked (count, shape, size, type)
    before any is converted; `convert_pictures=False` makes every check and converts none, leaving the
    request without its pictures: for a caller that checks its values early and makes the request
    again later at a size not known yet (the CLI, before the serving plan of a local launch).
    Raises LauncherError, naming the setting and the nearest valid value, before anything
    reaches a server.
    """
    from ..client.request import VideoRequest   # lazy: the server side imports models without the client

    for name, text in (("prompt", prompt), ("negative_prompt", negative_prompt)):
        if text is not None and not isinstance(text, str):
            raise LauncherError(f"The {name} is not text", f"it is a value of type {type(text).__name__}",
                                f"write the {name} as text", setting=name)
    if not (prompt or "").strip():
        raise LauncherError("The prompt is empty", "vLLM-Omni requires a prompt for Wan2.2",
                            "write a prompt", setting="prompt")
    given = {"width": width, "height": height, "frames": frames, "fps": fps, "steps": steps, "guidance": guidance,
             "guidance_2": guidance_2, "boundary_ratio": boundary_ratio, "flow_shift": flow_shift, "seed": seed}
    for name, value in given.items():
        _check_number(REQUEST_FIELDS[name], value)

    def positive(value: Optional[float], default: float) -> float:
        return default if value is None or value <= 0 else value

    width, height = positive(width, family.width), positive(height, family.height)
    frames = positive(frames, family.frames)
    _check_ranges(width=width, height=height, frames=frames)
    from ..client import media   # lazy, as for VideoRequest

    references = media.reference_count(reference_images)
    check_inputs(family, [name for name, on in (("image", image is not None), ("control_video", control_video),
                                                ("reference_images", references), ("audio", audio)) if on],
                 references=references)
    check_request(family, width=width, height=height, frames=frames, has_image=image is not None)
    if control_video is not None:
        media.check_control_fits(control_video.frames, control_video.width, control_video.height,
                                 frames=frames, width=width, height=height)
    two = family.experts == 2
    if family.pipeline == "dmd":
        _check_distilled(family, steps, guidance)
    sent = dict(zip(("guidance", "guidance_2"), guidance_as_sent(family, guidance, guidance_2)),
                fps=positive(fps, family.fps), steps=positive(steps, family.steps),
                boundary_ratio=_given(boundary_ratio, family.boundary_ratio) if two else None,
                flow_shift=_given(flow_shift, family.flow_shift) if family.pipeline == "wan" else None, seed=seed)
    _check_ranges(**sent)
    request = VideoRequest(
        prompt=prompt, negative_prompt=negative_prompt or None, width=width, height=height, num_frames=frames, **sent,
        control_video=control_video, audio=audio)
    if family.pipeline == "s2v" and audio is not None:
        # S2V's fps is fixed (upstream's S2V_OUTPUT_FPS, pipeline_wan2_2_s2v.py:74); another MP4 rate desyncs the audio
        if request.fps != family.fps:
            raise LauncherError(f"fps {request.fps:g} is not possible for {family.label}",
                                f"it generates {family.fps:g} frames a second to match the audio",
                                f"set fps to {family.fps:g} (0 on the node)", setting="fps")
        request.output_frames = media.s2v_output_frames(frames, audio.seconds, family.fps)
    # last: every other refusal comes before the pictures are checked, and every picture is checked before
    # any is converted
    from ..client.images import image_to_png, start_picture

    start = None if image is None else start_picture(image)
    pictures = media.reference_pictures(reference_images)
    if convert_pictures:
        size = (request.width, request.height)
        request.image_png = None if start is None else image_to_png(start, size)
        request.reference_images = tuple(media.reference_image(picture, *size) for picture in pictures)
    return request


def guidance_as_sent(family: WanFamily, guidance: Optional[float] = None,
                     guidance_2: Optional[float] = None) -> tuple[float, Optional[float]]:
    """(guidance, guidance_2) as a request sends them (None / a negative marker: the model's value;
    guidance_2 only for the two-expert A14B), without the request's other checks: what the launch
    plan needs to know whether jobs run CFG before their media exist."""
    return _given(guidance, family.guidance), (_given(guidance_2, family.guidance_2) if family.experts == 2 else None)


def _given(value: Optional[float], default: float) -> float:
    """A value where 0 is real: None or a negative marker (the node widgets' -1) takes the model's `default`."""
    return default if value is None or value < 0 else value


def _check_distilled(family: WanFamily, steps: Optional[int], guidance: Optional[float]) -> None:
    """A step-distilled model runs its own steps and guidance; a different value asked for would be
    dropped by the server without a word (pipeline_wan2_2.py:717-720, 732), so it is refused here."""
    for name, value, fixed in (("steps", steps, family.steps), ("guidance", guidance, family.guidance)):
        if value is not None and (value > 0 if name == "steps" else value >= 0) and value != fixed:
            raise LauncherError(f"{family.label} runs {fixed:g} as {name}, not {value:g}",
                                "it is step-distilled: the server uses the steps and guidance it was distilled "
                                "for and ignores the request's", f"leave {name} at the model's value "
                                f"({'0' if name == 'steps' else '-1'} on the node, or leave the option out)",
                                setting=name)
