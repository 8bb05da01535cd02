"""Media that goes *to* the server for VACE and speech-to-video: a control video, reference images, audio.

What crosses vLLM-Omni's `/v1/videos` form (docs/wan-pipelines.md, section 2): a control video as
the `input_reference` file part (the server decodes its first `num_frames` frames with OpenCV), one
reference image as that file part or several as an `image_reference` JSON list of data URLs (0.30),
audio as an `audio_reference` data URL. Upstream reads `input_reference` without any size limit and
Starlette refuses a text part over 1 MiB (so data URLs must fit in one), so every item is bounded
here, from its shape or its header, before anything is encoded or read: frame count, frame size,
seconds, bytes. Each item keeps its shape beside its bytes; equality and hashing use the shape only
(the poll cadence groups jobs by kind, not by pixels).

Plain Python + numpy + Pillow + PyAV (the encoder the decoder side already needs): no ComfyUI, no torch.
"""
from __future__ import annotations

import base64
import math
import io
import json
import os
import wave
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import numpy as np

from ..errors import LauncherError
from .images import check_picture, stretched, uint8_rgb

FORM_TEXT_PART_MAX = 1 << 20          # Starlette's max_part_size for a text part (formparsers.py:172-173)
MAX_REFERENCE_IMAGES = 4              # VACE R2V: one JSON part holds them all (< 1 MiB)
MAX_CONTROL_FRAMES = 257              # 4k+1; 16 s at 16 fps
MAX_CONTROL_PIXELS = 1280 * 720       # per frame; the largest size Wan is trained at
# reference images (and the I2V / S2V start image): shrunk to images.MAX_IMAGE_PIXELS as they are converted
CONTROL_VIDEO_MAX_BYTES = 256 << 20   # what the launcher uploads at most (upstream reads it unbounded)
CONTROL_CRF = 10                      # near-lossless H.264: the control signal is what VACE follows
AUDIO_RATE = 16000                    # wav2vec2's rate: S2V resamples to it anyway (pipeline_wan2_2_s2v.py:850-856)
AUDIO_FILE_MAX_BYTES = 64 << 20       # a WAV file the CLI reads at most
# 16 kHz mono PCM16 is 32,000 bytes a second; base64 adds a third; the data URL must fit in 1 MiB.
MAX_AUDIO_S = 20.0


@dataclass(frozen=True)
class ControlVideo:
    """A control video for VACE as the MP4 the server gets (H.264 yuv420p), with its shape."""

    frames: int
    width: int
    height: int
    mp4: bytes = field(repr=False, compare=False)


@dataclass(frozen=True)
class ReferenceImage:
    """One VACE reference image at the request's size (the server would stretch it so), as
    models.request_for makes it (reference_image) from the picture given."""

    width: int
    height: int
    jpeg: bytes = field(repr=False, compare=False)

    def data_url(self) -> str:
        return "data:image/jpeg;base64," + base64.b64encode(self.jpeg).decode("ascii")


@dataclass(frozen=True)
class AudioClip:
    """Speech or song for S2V as a 16 kHz mono PCM16 WAV, with its length."""

    seconds: float
    wav: bytes = field(repr=False, compare=False)

    def form_value(self) -> str:
        """The `audio_reference` form field, refused when it would not fit Starlette's 1 MiB text part."""
        value = json.dumps({"audio_url": "data:audio/wav;base64," + base64.b64encode(self.wav).decode("ascii")})
        _fits_text_part(value, "audio", f"The audio ({self.seconds:.1f} s) is too large to send",
                        f"shorten the audio to at most {MAX_AUDIO_S:g} s")
        return value


def reference_images_value(images: tuple[ReferenceImage, ...]) -> str:
    """The `image_reference` JSON list (0.30) of several references, refused past 1 MiB."""
    value = json.dumps([{"image_url": image.data_url()} for image in images])
    _fits_text_part(value, "reference_images", f"{len(images)} reference images are too large to send",
                    "use fewer reference images or a smaller width/height")
    return value


def _fits_text_part(value: str, setting: str, what: str, fix: str) -> None:
    if len(value) > FORM_TEXT_PART_MAX:
        raise LauncherError(
            what, f"vLLM-Omni takes it as one form text field, and its web framework (Starlette) refuses a field over "
            f"1 MiB; this one would be {len(value) / (1 << 20):.2f} MiB", fix, setting=setting)


def check_control_fits(got_frames: int, got_width: int, got_height: int, *, frames: int, width: int,
                       height: int) -> None:
    """A control video of got_frames x got_width x got_height against the request's shape: the node checks
    an IMAGE batch's shape with it before encoding anything, models.request_for the encoded video."""
    if (got_width, got_height) != (width, height):
        raise LauncherError(
            f"The control video is {got_width}x{got_height}, the request {width}x{height}",
            "VACE conditions on the control video at its own size while it denoises at the request's, so "
            "the two must match (upstream fails the job late otherwise)",
            f"resize the control video to {width}x{height} (e.g. with an Upscale Image node), or set width "
            f"and height to {got_width} and {got_height}", setting="control_video")
    if got_frames != frames:
        raise LauncherError(
            f"The control video has {got_frames} frames, the request {frames}",
            "VACE follows the control video frame by frame; the server keeps only its first frames and "
            "fails on a shorter one", f"pass {frames} frames (e.g. Image From Batch's length), or set frames to "
            "the video's count if that is 4k+1", setting="control_video")


# ----------------------------------------------------------------------------- control video
def control_video_from_frames(frames: Any, fps: float = 16.0) -> ControlVideo:
    """A ComfyUI IMAGE batch [F, H, W, 3] (float 0..1 or uint8) as the control MP4.

    Shape and size are checked before anything is encoded; encoding stops past CONTROL_VIDEO_MAX_BYTES."""
    arr = np.asarray(frames) if not hasattr(frames, "shape") else frames
    shape = tuple(int(s) for s in getattr(arr, "shape", ()))
    if len(shape) != 4 or shape[3] not in (3, 4) or min(shape) < 1:
        raise LauncherError(f"The control video has shape {shape}",
                            "it must be a batch of RGB frames [frames, height, width, 3] (a ComfyUI IMAGE batch)",
                            "connect the IMAGE output of a video loader (e.g. Load Video) to 'control_video'",
                            setting="control_video")
    count, height, width = shape[0], shape[1], shape[2]
    _check_control_shape(count, width, height)
    av = _import_av()
    out = io.BytesIO()
    with av.open(out, mode="w", format="mp4") as container:
        stream = container.add_stream("h264", rate=max(1, round(float(fps))))
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.options = {"crf": str(CONTROL_CRF), "preset": "fast"}
        for index in range(count):
            frame = av.VideoFrame.from_ndarray(uint8_rgb(np.asarray(arr[index]), "The control video", "control_video"),
                                               format="rgb24")
            for packet in stream.encode(frame):
                container.mux(packet)
            if out.tell() > CONTROL_VIDEO_MAX_BYTES:
                raise _control_too_large(out.tell())
        for packet in stream.encode():
            container.mux(packet)
    data = out.getvalue()
    if len(data) > CONTROL_VIDEO_MAX_BYTES:
        raise _control_too_large(len(data))
    return ControlVideo(count, width, height, data)


def control_video_from_mp4(path: str) -> ControlVideo:
    """An H.264 MP4 on disk as the control video, from its header (no frame decoded): its size in
    bytes is checked before it is read, its frame count and size after the header is parsed."""
    from .frames import probe_mp4  # noqa: PLC0415 (PyAV is imported lazily)

    try:
        size = os.stat(path).st_size
    except OSError as exc:
        raise LauncherError(f"Cannot read the control video {path}", str(exc),
                            "pass the path of an MP4 file to --control-video", setting="control_video") from exc
    if size > CONTROL_VIDEO_MAX_BYTES:
        raise _control_too_large(size)
    with open(path, "rb") as handle:
        data = handle.read(CONTROL_VIDEO_MAX_BYTES + 1)
    try:
        info = probe_mp4(data)          # the same door as the server's clips: MP4, H.264 yuv420p, header only
    except LauncherError as exc:
        raise LauncherError(f"The control video {path} is not an H.264 MP4 the launcher can send",
                            "the launcher sends a control video only as an MP4 of H.264 yuv420p video, checked "
                            "from its header; this file is not one",
                            "convert it: ffmpeg -i IN -c:v libx264 -pix_fmt yuv420p -an control.mp4",
                            setting="control_video", raw=f"{exc.what}: {exc.why}") from exc
    _check_control_shape(info.num_frames, info.width, info.height)
    return ControlVideo(info.num_frames, info.width, info.height, data)


def _check_control_shape(frames: int, width: int, height: int) -> None:
    if frames > MAX_CONTROL_FRAMES or width * height > MAX_CONTROL_PIXELS:
        raise LauncherError(
            f"The control video is {width}x{height} with {frames} frames",
            f"the launcher sends at most {MAX_CONTROL_FRAMES} frames of at most {MAX_CONTROL_PIXELS} pixels "
            "(1280x720): Wan is trained up to there and the server decodes it all into memory",
            "trim and resize it to the request's width x height and frame count (e.g. 832x480, 81 frames)",
            setting="control_video")


def _control_too_large(size: int) -> LauncherError:
    return LauncherError(
        f"The control video is over {CONTROL_VIDEO_MAX_BYTES >> 20} MiB ({size >> 20} MiB)",
        "vLLM-Omni reads the upload whole into memory without a limit, so the launcher caps it",
        "use fewer frames or a smaller size", setting="control_video")


# ----------------------------------------------------------------------------- reference images
def reference_count(images: Optional[Sequence[Any]]) -> int:
    """How many reference images `images` holds (see reference_pictures), from its shape or length alone:
    what the cap (check_reference_count) is checked against before any picture is looked at."""
    if images is None:
        return 0
    shape = getattr(images, "shape", None)
    if shape is None:
        return len(images)
    return int(shape[0]) if len(shape) == 4 else 1


def reference_pictures(images: Optional[Sequence[Any]]) -> tuple[np.ndarray, ...]:
    """The reference images as given (an IMAGE batch [N, H, W, C]; one picture; or a sequence of pictures,
    each [H, W, C] or [1, H, W, C], float 0..1 or uint8) as one checked picture [H, W, C] each: their count
    first (check_reference_count), then every one's shape, size and type, before any pixel is converted."""
    count = reference_count(images)
    check_reference_count(count)
    if count == 0:
        return ()
    shape = getattr(images, "shape", None)
    pictures = [images] if shape is not None and len(shape) != 4 else images
    return tuple(_reference_picture(pictures[i]) for i in range(count))


def _reference_picture(image: Any) -> np.ndarray:
    """One reference ([H, W, C] or [1, H, W, C]) as [H, W, C], refused for its shape, size or type without
    converting a pixel: reference_pictures checks them all with it before reference_image encodes any."""
    arr = np.asarray(image)
    if arr.ndim == 4 and arr.shape[0] == 1:
        arr = arr[0]
    if arr.ndim != 3 or arr.shape[2] not in (3, 4) or arr.shape[0] < 1 or arr.shape[1] < 1:
        raise LauncherError(f"A reference image has shape {tuple(np.asarray(image).shape)}",
                            "each reference must be one RGB image [H, W, 3]",
                            "connect an IMAGE (e.g. Load Image) to 'reference_images'", setting="reference_images")
    check_picture(arr, "A reference image", "reference_images")
    return arr


def reference_image(image: Any, width: int, height: int) -> ReferenceImage:
    """One image (ComfyUI IMAGE [1, H, W, 3] / [H, W, 3], float 0..1 or uint8) as a reference at
    width x height (models.request_for's, which calls this last): the LANCZOS stretch vLLM-Omni applies
    itself (images.stretched), from the picture shrunk to at most images.MAX_IMAGE_PIXELS first (block
    averages, never a full-size copy)."""
    picture = stretched(_reference_picture(image), (width, height), "A reference image", "reference_images")
    out = io.BytesIO()
    picture.save(out, format="JPEG", quality=92)
    return ReferenceImage(int(width), int(height), out.getvalue())


def check_reference_count(count: int, name: str = "reference_images") -> None:
    """The one cap on reference images, checked before any is read or encoded; `name` is the surface's
    word for them (the node input, the CLI's --reference-image)."""
    if count > MAX_REFERENCE_IMAGES:
        raise LauncherError(f"{count} reference images were given",
                            f"VACE takes at most {MAX_REFERENCE_IMAGES} here: they travel in one form field "
                            "of at most 1 MiB", f"pass at most {MAX_REFERENCE_IMAGES} images as {name}",
                            setting=name)


# ----------------------------------------------------------------------------- audio
def audio_clip(waveform: Any, sample_rate: int) -> AudioClip:
    """Audio ([channels, samples], [samples], or ComfyUI's [1, channels, samples]) as 16 kHz mono
    PCM16 WAV. Its length is checked from the shape before anything is converted."""
    arr = np.asarray(waveform)
    if arr.ndim == 3 and arr.shape[0] == 1:
        arr = arr[0]
    if arr.ndim == 1:
        arr = arr[None, :]
    rate = int(sample_rate) if isinstance(sample_rate, (int, np.integer)) and not isinstance(sample_rate, bool) else 0
    if arr.ndim != 2 or arr.shape[1] < 1 or rate < 1000 or rate > 384000 or arr.dtype.kind not in "fiu":
        raise LauncherError("The audio is not a waveform",
                            f"it has shape {tuple(np.asarray(waveform).shape)} at sample rate {sample_rate!r}",
                            "connect an AUDIO output (e.g. Load Audio) to 'audio'", setting="audio")
    seconds = arr.shape[1] / rate
    _check_audio_seconds(seconds)
    mono = arr.astype(np.float32, copy=False).mean(axis=0)
    if arr.dtype.kind in "iu":
        mono = mono / float(np.iinfo(arr.dtype).max)
    target = max(1, round(seconds * AUDIO_RATE))
    resampled = np.interp(np.linspace(0.0, arr.shape[1] - 1, target), np.arange(arr.shape[1]), mono)
    pcm = (np.clip(np.nan_to_num(resampled), -1.0, 1.0) * 32767.0).astype("<i2")
    out = io.BytesIO()
    with wave.open(out, "wb") as writer:
        writer.setnchannels(1)
        writer.setsampwidth(2)
        writer.setframerate(AUDIO_RATE)
        writer.writeframes(pcm.tobytes())
    return AudioClip(round(seconds, 3), out.getvalue())


def audio_clip_from_wav(path: str) -> AudioClip:
    """A PCM WAV file (8/16/32-bit) as the S2V audio; its length is read from the header first."""
    try:
        if os.stat(path).st_size > AUDIO_FILE_MAX_BYTES:
            raise LauncherError(f"The audio file {path} is over {AUDIO_FILE_MAX_BYTES >> 20} MiB",
                                f"speech-to-video takes at most {MAX_AUDIO_S:g} s of audio",
                                f"cut it to at most {MAX_AUDIO_S:g} s", setting="audio")
        with wave.open(path, "rb") as reader:
            rate, channels, width, count = (reader.getframerate(), reader.getnchannels(), reader.getsampwidth(),
                                            reader.getnframes())
            _check_audio_seconds(count / rate if rate else float("inf"))
            raw = reader.readframes(count)
    except (OSError, EOFError, wave.Error) as exc:
        raise LauncherError(f"Cannot read the audio file {path}", str(exc),
                            "pass a PCM WAV file to --audio (e.g. ffmpeg -i in.mp3 -ac 1 -ar 16000 out.wav)",
                            setting="audio") from exc
    dtype = {1: "u1", 2: "<i2", 4: "<i4"}.get(width)
    if dtype is None:
        raise LauncherError(f"The audio file {path} has {8 * width}-bit samples",
                            "the launcher reads 8, 16 and 32-bit PCM WAV",
                            "convert it: ffmpeg -i in.wav -c:a pcm_s16le out.wav",
                            setting="audio")
    samples = np.frombuffer(raw, dtype=dtype).reshape(-1, channels).T
    if dtype == "u1":                    # 8-bit WAV is unsigned, centred on 128
        samples = (samples.astype(np.float32) - 128.0) / 128.0
    return audio_clip(samples, rate)


def _check_audio_seconds(seconds: float) -> None:
    if not seconds <= MAX_AUDIO_S:
        raise LauncherError(
            f"The audio is {seconds:.1f} s long",
            f"speech-to-video takes at most {MAX_AUDIO_S:g} s here: the audio travels as one form field of at most "
            "1 MiB (16 kHz mono WAV), and the clip grows with it (one 80-frame clip per 5 s)",
            f"trim the audio to {MAX_AUDIO_S:g} s or less", setting="audio")


def s2v_output_frames(frames_per_clip: int, audio_seconds: float, fps: float) -> tuple[int, int]:
    """The frame counts an S2V clip may have: one `frames_per_clip` clip per started
    frames_per_clip/fps s of audio (`fps`: the family's, which S2V cannot change), less the 3
    frames upstream drops from the first (pipeline_wan2_2_s2v.py:157-219, 1486-1490); one clip
    either side for rounding of the audio's length."""
    clips = max(1, math.ceil(audio_seconds * fps / frames_per_clip))
    return max(1, (clips - 1) * frames_per_clip - 3), (clips + 1) * frames_per_clip


# ----------------------------------------------------------------------------- shared
def _import_av() -> Any:
    from .frames import _import_av as import_av  # noqa: PLC0415 (one owner of the PyAV import message)

    return import_av()


__all__ = ["AudioClip", "ControlVideo", "MAX_AUDIO_S", "MAX_CONTROL_FRAMES", "MAX_REFERENCE_IMAGES", "ReferenceImage",
           "audio_clip", "audio_clip_from_wav", "check_control_fits", "check_reference_count",
           "control_video_from_frames", "control_video_from_mp4", "reference_count", "reference_image",
           "reference_pictures", "reference_images_value", "s2v_output_frames"]
