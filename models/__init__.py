"""The rules a Wan request must meet and the one place its defaults are filled in.

Upstream vLLM-Omni silently rewrites bad request values (frames to 4k+1, sizes floored) or
fails the job late (I2V sizes, missing media). We keep the rules here, once, so the spec, the
planner, the client and the nodes agree and can tell the user the nearest valid value before
a GPU minute is spent. The families themselves (identity, shape, defaults, local folders) are
models/families.py's; they are re-exported here so callers import the model layer from one place.
"""
from __future__ import annotations

import math
import numbers
from typing import TYPE_CHECKING, Optional

from ..errors import LauncherError
from .families import (ALL_FAMILIES, FAMILIES, LOCAL_PREFIX, PIPELINE_FAMILIES, LocalModel, WanFamily,
                       family_for, family_of_folder, find_local_models, is_s2v_original)

if TYPE_CHECKING:
    from ..client.media import AudioClip, ControlVideo, ReferenceImage
    from ..client.request import VideoRequest

__all__ = ["ALL_FAMILIES", "FAMILIES", "LOCAL_PREFIX", "PIPELINE_FAMILIES", "S2V_FRAMES_PER_CLIP_MAX", "LocalModel",
           "WanFamily", "check_media", "check_request", "family_for", "family_of_folder", "find_local_models",
           "guidance_as_sent", "is_s2v_original", "nearest_frames", "request_for"]


S2V_FRAMES_PER_CLIP_MAX = 120    # per-clip frames (memory grows with them; upstream's default is 80)


def nearest_frames(frames: int) -> int:
    """Nearest valid Wan frame count (4k+1), never below 1."""
    k = max(0, round((frames - 1) / 4))
    return 4 * k + 1


def check_request(family: WanFamily, *, width: int, height: int, frames: int, has_image: bool) -> None:
    """Refuse request shapes upstream would rewrite silently or fail late, naming the fix."""
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
        if not has_image:
            raise LauncherError(
                f"{family.label} needs a reference image",
                "speech-to-video animates the person in one image; upstream fails the job with 'No reference "
                "image provided'", "connect an IMAGE (the face or portrait) to the 'image' input", setting="image")
        return
    if frames < 1 or (frames - 1) % 4:
        raise LauncherError(
            f"frames {frames} is not valid for Wan2.2",
            "the frame count must be 4k+1 (Wan's VAE packs 4 frames per latent after the first)",
            f"set frames to {nearest_frames(frames)}",
            setting="frames",
        )
    if family.image_input == "required" and not has_image:
        raise LauncherError(
            f"{family.label} needs a start image",
            "it is an image-to-video model; upstream fails the job with 'No image is provided'",
            "connect an IMAGE to the 'image' input, or load T2V-A14B / TI2V-5B for text-only video",
            setting="image",
        )
    if family.image_input == "none" and has_image:
        raise LauncherError(
            f"{family.label} ignores images",
            "the T2V-A14B pipeline runs text-to-video only, so the image would be dropped silently",
            "disconnect the image, or load I2V-A14B or TI2V-5B for image-to-video",
            setting="image",
        )


def _check_s2v_frames(frames: int) -> None:
    if frames < 16 or frames > S2V_FRAMES_PER_CLIP_MAX or frames % 4:
        near = min(S2V_FRAMES_PER_CLIP_MAX, max(16, round(frames / 4) * 4))
        raise LauncherError(
            f"frames {frames} is not valid for speech-to-video",
            "for S2V, frames is the length of each clip (the audio decides how many clips); upstream uses 80, "
            f"and the launcher takes multiples of 4 from 16 to {S2V_FRAMES_PER_CLIP_MAX}",
            f"set frames to {near}", setting="frames")


def check_media(family: WanFamily, *, width: int, height: int, frames: int, control_video: Optional["ControlVideo"],
                reference_images: tuple["ReferenceImage", ...], audio: Optional["AudioClip"]) -> None:
    """Refuse media the family cannot take, or that does not fit the request, before it is sent
    (docs/wan-pipelines.md, sections 3-4: what VACE and S2V do with a mismatched input)."""
    given = [name for name, on in (("control_video", control_video), ("reference_images", reference_images),
                                   ("audio", audio)) if on]
    takes = {"vace": ("control_video", "reference_images"), "s2v": ("audio",)}.get(family.pipeline, ())
    for name in given:
        if name not in takes:
            raise LauncherError(
                f"{family.label} does not take {name.replace('_', ' ')}",
                "only VACE models take a control video or reference images, and only S2V takes audio",
                f"disconnect '{name}', or load " + ("Wan2.1 VACE" if name != "audio" else "Wan2.2 S2V-14B"),
                setting=name)
    if family.pipeline == "s2v" and audio is None:
        raise LauncherError(f"{family.label} needs audio", "speech-to-video follows the audio (upstream fails "
                            "the job with 'No audio provided')", "connect an AUDIO (e.g. Load Audio) to 'audio'",
                            setting="audio")
    from ..client.media import check_fits   # lazy, as for VideoRequest

    check_fits(width=width, height=height, frames=frames, control_video=control_video,
               reference_images=reference_images)


# ----------------------------------------------------------------------------- requests
def _check_number(name: str, value: object, whole: bool) -> None:
    """A request value must be None or a finite number (a whole one for `whole`): NaN, inf, text
    and lists would reach the server as "nan" or fail deep inside the launcher."""
    if value is None:
        return
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return
    if isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value) \
            and (not whole or float(value).is_integer()):
        return
    shown = f"the number {value}" if isinstance(value, float) else f"a value of type {type(value).__name__}"
    number = "a whole number" if whole else "a finite number"
    marker = "" if name == "seed" else (" (0 for the model's recommended value)" if whole or name == "fps" else
                                        " (-1 for the model's recommended value)")
    raise LauncherError(f"{name} is not valid: it is {shown}", f"{name} takes {number}",
                        f"set {name} to {number}{marker}", setting=name)


def request_for(family: WanFamily, *, prompt: str, negative_prompt: Optional[str] = None,
                width: Optional[int] = None, height: Optional[int] = None, frames: Optional[int] = None,
                fps: Optional[float] = None, steps: Optional[int] = None, guidance: Optional[float] = None,
                guidance_2: Optional[float] = None, boundary_ratio: Optional[float] = None,
                flow_shift: Optional[float] = None, seed: Optional[int] = None,
                image_png: Optional[bytes] = None, control_video: Optional["ControlVideo"] = None,
                reference_images: tuple["ReferenceImage", ...] = (),
                audio: Optional["AudioClip"] = None) -> "VideoRequest":
    """The one place request defaults are filled in and checked (nodes and CLI).

    A value left out takes the model's recommended one: None, or the node widgets' markers
    (0 for width, height, frames, fps and steps; any negative number for guidance,
    guidance_2, boundary_ratio and flow_shift, where 0 is a real value). guidance_2 and
    boundary_ratio are sent only to the two-expert A14B models. A step-distilled ("dmd") family
    sends its own steps and guidance (the server runs those whatever is sent; another value is
    refused); flow_shift goes to plain Wan only (VACE, S2V and DMD read the server's --flow-shift).
    VACE takes `control_video` or `reference_images`, S2V `image_png` plus `audio` (client/media.py).
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
    for name, value, whole in (("width", width, True), ("height", height, True), ("frames", frames, True),
                               ("fps", fps, False), ("steps", steps, True), ("guidance", guidance, False),
                               ("guidance_2", guidance_2, False), ("boundary_ratio", boundary_ratio, False),
                               ("flow_shift", flow_shift, False), ("seed", seed, True)):
        _check_number(name, value, whole)

    def positive(value: Optional[float], default: float) -> float:
        return default if value is None or value <= 0 else value

    def given(value: Optional[float], default: float) -> float:
        return default if value is None or value < 0 else value

    width, height = positive(width, family.width), positive(height, family.height)
    frames = positive(frames, family.frames)
    check_request(family, width=width, height=height, frames=frames, has_image=image_png is not None)
    reference_images = tuple(reference_images)
    check_media(family, width=width, height=height, frames=frames, control_video=control_video,
                reference_images=reference_images, audio=audio)
    two = family.experts == 2
    if family.pipeline == "dmd":
        _check_distilled(family, steps, guidance)
    guidance, guidance_2 = guidance_as_sent(family, guidance, guidance_2)
    request = VideoRequest(
        prompt=prompt, negative_prompt=negative_prompt or None, width=width, height=height, num_frames=frames,
        fps=positive(fps, family.fps), steps=positive(steps, family.steps), guidance=guidance, guidance_2=guidance_2,
        boundary_ratio=given(boundary_ratio, family.boundary_ratio) if two else None,
        flow_shift=given(flow_shift, family.flow_shift) if family.pipeline == "wan" else None,
        seed=seed, image_png=image_png,
        control_video=control_video, reference_images=reference_images, audio=audio)
    if family.pipeline == "s2v" and audio is not None:
        from ..client.media import s2v_output_frames

        if request.fps != 16:     # S2V makes 16 fps (S2V_OUTPUT_FPS); another MP4 rate desyncs the audio
            raise LauncherError(f"fps {request.fps:g} is not possible for {family.label}", "it generates 16 "
                                "frames a second to match the audio", "set fps to 16 (0 on the node)", setting="fps")
        request.output_frames = s2v_output_frames(frames, audio.seconds)
    return request


def guidance_as_sent(family: WanFamily, guidance: Optional[float] = None,
                     guidance_2: Optional[float] = None) -> tuple[float, Optional[float]]:
    """(guidance, guidance_2) as a request sends them (None / a negative marker: the model's value;
    guidance_2 only for the two-expert A14B), without the request's other checks: what the launch
    plan needs to know whether jobs run CFG before their media exist."""
    def given(value: Optional[float], default: float) -> float:
        return default if value is None or value < 0 else value
    return given(guidance, family.guidance), (given(guidance_2, family.guidance_2) if family.experts == 2 else None)


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
