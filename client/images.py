"""A ComfyUI IMAGE (or any array-like picture) to PNG bytes, for the I2V `input_reference` upload,
and the one conversion of a picture to uint8 RGB that the media sent to the server shares (media.py).

The other direction of client/frames.py, kept apart because it needs Pillow and nothing of PyAV.
Plain Python + numpy + Pillow: no ComfyUI and no torch (a torch CPU tensor works through
`np.asarray`).

A picture is a stranger's input: ComfyUI's own Empty Image makes 16384x16384 (3 GiB as float32),
and the server reads an upload whole. So its size is refused before anything is converted
(MAX_IMAGE_PIXELS: its PNG is then at most ~48 MiB, pure noise being the worst case), and the conversion
holds at most ROW_BLOCK_PIXELS of float beside the uint8 copy.
"""
from __future__ import annotations

import io
from typing import Any

import numpy as np

from ..errors import LauncherError

# The largest width x height Generate Video's widgets can ask for (4096x4096), 18x Wan's largest trained
# frame (1280x720). A 12 MP phone photo or a 4K frame passes; the server shrinks any start or reference
# image to the request's size anyway, so a larger one only costs memory here and a bigger upload.
MAX_IMAGE_PIXELS = 4096 * 4096
ROW_BLOCK_PIXELS = 1 << 18            # pixels converted at a time: 3 MiB of float32 beside the uint8 copy


def check_image_pixels(width: int, height: int, what: str, setting: str, size_hint: str = "the video's size") -> None:
    """Refuse a picture over MAX_IMAGE_PIXELS, naming the input; nothing is converted before this."""
    if width * height > MAX_IMAGE_PIXELS:
        raise LauncherError(
            f"{what} is {width}x{height} ({width * height / 1e6:.1f} MP)",
            f"the launcher takes images of at most {MAX_IMAGE_PIXELS / 1e6:.1f} MP (4096x4096, the largest video "
            "size the widgets allow): the server shrinks it to the video's size anyway, and a larger one costs "
            "memory here and an upload the server reads whole",
            f"resize it to {size_hint} with ComfyUI's Upscale Image node before '{setting}'", setting=setting)


def uint8_rgb(arr: np.ndarray, what: str, setting: str) -> np.ndarray:
    """[H, W, 3] (or [H, W, 4], alpha dropped; or [H, W], grey) float 0..1 or integer as uint8, float
    clipped to 0..1 (NaN as 0). Converted ROW_BLOCK_PIXELS at a time into one uint8 array, so a float
    picture never gets a full-size float copy; uint8 is returned as is (contiguous)."""
    if arr.ndim == 3 and arr.shape[2] == 4:
        arr = arr[:, :, :3]
    if arr.dtype == np.uint8:
        return np.ascontiguousarray(arr)
    if arr.dtype.kind not in "fiub":
        raise LauncherError(f"{what} has unsupported type {arr.dtype}", "it must hold numbers (float 0..1 or uint8)",
                            f"connect an IMAGE output (e.g. Load Image) to '{setting}'", setting=setting)
    out = np.empty(arr.shape, dtype=np.uint8)
    rows = max(1, ROW_BLOCK_PIXELS // max(1, arr.shape[1]))
    for start in range(0, arr.shape[0], rows):
        block = arr[start:start + rows]
        if block.dtype.kind != "f":
            out[start:start + rows] = np.clip(block, 0, 255)
            continue
        with np.errstate(over="ignore", invalid="ignore"):     # inf and huge values: clipped to 255 below
            scaled = block.astype(np.float32)                  # a block-sized copy; the input is untouched
            scaled *= 255.0
            scaled += 0.5
        np.clip(scaled, 0, 255, out=scaled)                    # -inf to 0, inf to 255
        scaled[np.isnan(scaled)] = 0
        out[start:start + rows] = scaled
    return out


def image_to_png(image: Any, *, compress_level: int = 1) -> bytes:
    """One image as PNG bytes for the `input_reference` upload.

    Accepts [H, W, 3] (or [H, W, 4], alpha dropped; or [H, W] / [H, W, 1], grey) as
    float 0..1 or uint8, and ComfyUI's IMAGE batch shape [1, H, W, C]. A torch CPU
    tensor works too (anything `np.asarray` takes). Float values are clipped to 0..1.
    Its size is checked before it is converted, the PNG's while it is written.
    """
    from PIL import Image  # noqa: PLC0415

    arr = np.asarray(image)
    if arr.ndim == 4:
        if arr.shape[0] != 1:
            raise LauncherError(
                f"The start image is a batch of {arr.shape[0]} images",
                "image-to-video takes one start image",
                "pass a single image (e.g. with an 'Image From Batch' node)",
                setting="image",
            )
        arr = arr[0]
    if arr.ndim == 3 and arr.shape[2] == 1:
        arr = arr[:, :, 0]
    if not (arr.ndim == 2 or (arr.ndim == 3 and arr.shape[2] in (3, 4))) or arr.shape[0] < 1 or arr.shape[1] < 1:
        raise LauncherError(
            f"The start image has shape {tuple(np.asarray(image).shape)}",
            "it must be one RGB image [H, W, 3] (ComfyUI IMAGE [1, H, W, 3])",
            "connect an IMAGE output (e.g. Load Image) to the 'image' input",
            setting="image",
        )
    check_image_pixels(arr.shape[1], arr.shape[0], "The start image", "image")
    buf = io.BytesIO()
    Image.fromarray(uint8_rgb(arr, "The start image", "image")).save(buf, format="PNG", compress_level=compress_level)
    return buf.getvalue()


__all__ = ["MAX_IMAGE_PIXELS", "check_image_pixels", "image_to_png", "uint8_rgb"]
