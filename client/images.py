"""A ComfyUI IMAGE (or any array-like picture) to PNG bytes, for the I2V `input_reference` upload.

The other direction of client/frames.py, kept apart because it needs Pillow and nothing of PyAV.
Plain Python + numpy + Pillow: no ComfyUI and no torch (a torch CPU tensor works through
`np.asarray`).
"""
from __future__ import annotations

import io
from typing import Any

import numpy as np

from ..errors import LauncherError


def image_to_png(image: Any, *, compress_level: int = 1) -> bytes:
    """One image as PNG bytes for the `input_reference` upload.

    Accepts [H, W, 3] (or [H, W, 4], alpha dropped; or [H, W] / [H, W, 1], grey) as
    float 0..1 or uint8, and ComfyUI's IMAGE batch shape [1, H, W, C]. A torch CPU
    tensor works too (anything `np.asarray` takes). Float values are clipped to 0..1.
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
    if arr.ndim == 3 and arr.shape[2] == 4:
        arr = arr[:, :, :3]
    if not (arr.ndim == 2 or (arr.ndim == 3 and arr.shape[2] == 3)) or arr.shape[0] < 1 or arr.shape[1] < 1:
        raise LauncherError(
            f"The start image has shape {tuple(np.asarray(image).shape)}",
            "it must be one RGB image [H, W, 3] (ComfyUI IMAGE [1, H, W, 3])",
            "connect an IMAGE output (e.g. Load Image) to the 'image' input",
            setting="image",
        )
    if arr.dtype != np.uint8:
        if arr.dtype.kind not in "fiub":
            raise LauncherError(f"The start image has unsupported type {arr.dtype}",
                                "it must hold numbers (float 0..1 or uint8)",
                                "connect an IMAGE output to the 'image' input", setting="image")
        if arr.dtype.kind == "f":
            arr = np.clip(np.nan_to_num(arr.astype(np.float32, copy=False)) * 255.0 + 0.5, 0, 255).astype(np.uint8)
        else:
            arr = np.clip(arr, 0, 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(arr)).save(buf, format="PNG", compress_level=compress_level)
    return buf.getvalue()


__all__ = ["image_to_png"]
