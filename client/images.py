"""A ComfyUI IMAGE (or any array-like picture) to PNG bytes, for the I2V `input_reference` upload,
and the conversions of a picture to uint8 RGB that the media sent to the server share (media.py).

The other direction of client/frames.py, kept apart because it needs Pillow and nothing of PyAV.
Plain Python + numpy + Pillow: no ComfyUI and no torch (a torch CPU tensor works through
`np.asarray`).

A picture is a stranger's input, and a user's 24 MP phone photo is an ordinary one. vLLM-Omni
stretches every start or reference image to the request's width x height itself (serving_video.py:351-363
in 0.30: Pillow LANCZOS of the decoded RGB picture, aspect not kept, skipped when the size already
matches), so the launcher makes that stretch here and sends the picture at the request's size
(`stretched`): the server gets the same pixels from a small upload instead of a full-size PNG to encode,
send and decode. A picture over MAX_IMAGE_PIXELS is not refused but shrunk first by an integer factor
(each k x k block averaged) to at most MAX_IMAGE_PIXELS, its aspect kept. What
the launcher allocates is bounded whatever the input's size: one tile of ROW_BLOCK_PIXELS floats at
a time beside the uint8 result, which holds at most MAX_IMAGE_PIXELS (its PNG then at most ~48 MiB,
pure noise being the worst case). The input itself is already in memory (ComfyUI made it); only one
over MAX_INPUT_PIXELS is refused, before anything is allocated.
"""
from __future__ import annotations

import io
from typing import Any, Optional

import numpy as np

from ..errors import LauncherError

# The largest picture the launcher converts whole: the largest width x height Generate Video's widgets
# can ask for (4096x4096), 18x Wan's largest trained frame (1280x720). A larger one is shrunk to it.
MAX_IMAGE_PIXELS = 4096 * 4096
# The largest picture the launcher shrinks (32768x32768, 4x ComfyUI's largest Empty Image, 16384x16384):
# as float32 it already holds 12 GiB, its shrinking costs CPU time in proportion, and a zero-stride view
# (np.broadcast_to, torch's expand) can claim any size without the memory behind it.
MAX_INPUT_PIXELS = 1 << 30
ROW_BLOCK_PIXELS = 1 << 18            # pixels converted at a time: 3 MiB of float32 beside the uint8 result


def _check_numbers(arr: np.ndarray, what: str, setting: str) -> None:
    if arr.dtype.kind not in "fiub":
        raise LauncherError(f"{what} has unsupported type {arr.dtype}", "it must hold numbers (float 0..1 or uint8)",
                            f"connect an IMAGE output (e.g. Load Image) to '{setting}'", setting=setting)


def _scaled(block: np.ndarray) -> np.ndarray:
    """A float32 copy of `block` on the 0..255 scale (float input is 0..1), clipped, NaN as 0."""
    with np.errstate(over="ignore", invalid="ignore"):     # inf and huge values: clipped to 255 below
        scaled = block.astype(np.float32)                  # a block-sized copy; the input is untouched
        if block.dtype.kind == "f":
            scaled *= 255.0
    np.clip(scaled, 0, 255, out=scaled)                    # -inf to 0, inf to 255
    scaled[np.isnan(scaled)] = 0
    return scaled


def uint8_rgb(arr: np.ndarray, what: str, setting: str) -> np.ndarray:
    """[H, W, 3] (or [H, W, 4], alpha dropped; or [H, W], grey) float 0..1 or integer as uint8, float
    clipped to 0..1 (NaN as 0), at its own size. Converted ROW_BLOCK_PIXELS at a time into one uint8
    array, so a float picture never gets a full-size float copy; uint8 is returned as is (contiguous).
    The caller bounds the size (control video frames; capped_uint8_rgb)."""
    if arr.ndim == 3 and arr.shape[2] == 4:
        arr = arr[:, :, :3]
    if arr.dtype == np.uint8:
        return np.ascontiguousarray(arr)
    _check_numbers(arr, what, setting)
    out = np.empty(arr.shape, dtype=np.uint8)
    rows = max(1, ROW_BLOCK_PIXELS // max(1, arr.shape[1]))
    for start in range(0, arr.shape[0], rows):
        block = arr[start:start + rows]
        if block.dtype.kind != "f":
            out[start:start + rows] = np.clip(block, 0, 255)
            continue
        scaled = _scaled(block)
        scaled += 0.5
        out[start:start + rows] = scaled
    return out


def shrink_factor(width: int, height: int) -> int:
    """The smallest integer k whose k x k blocks bring width x height to at most MAX_IMAGE_PIXELS
    (1 for a picture within it); a partial block at the right or bottom edge is one output pixel."""
    k = max(1, int(np.ceil(np.sqrt(width * height / MAX_IMAGE_PIXELS))))
    while -(-width // k) * -(-height // k) > MAX_IMAGE_PIXELS:
        k += 1
    return k


def check_picture(arr: np.ndarray, what: str, setting: str) -> None:
    """The refusals capped_uint8_rgb makes before it converts anything: a picture over MAX_INPUT_PIXELS
    or one not of numbers. Apart, so that a request checks every picture it has before converting any."""
    height, width = int(arr.shape[0]), int(arr.shape[1])
    if width * height > MAX_INPUT_PIXELS:
        raise LauncherError(
            f"{what} is {width}x{height} ({width * height / 1e6:.1f} MP)",
            f"the launcher shrinks pictures of up to {MAX_INPUT_PIXELS / 1e6:.1f} MP (32768x32768) to at most "
            "the largest video size (4096x4096); this one is far past any video, and shrinking it costs time in "
            "proportion", f"resize it with ComfyUI's Upscale Image node before '{setting}'", setting=setting)
    _check_numbers(arr, what, setting)


def capped_uint8_rgb(arr: np.ndarray, what: str, setting: str) -> np.ndarray:
    """A picture as uint8_rgb takes it, as uint8 of at most MAX_IMAGE_PIXELS: one within the cap is
    uint8_rgb's; a larger one is the average of each k x k block (k = shrink_factor), computed one
    tile of at most ROW_BLOCK_PIXELS input pixels at a time (values clipped and NaN as 0 first, as
    uint8_rgb does), so no full-size copy of it is made in any type. One over MAX_INPUT_PIXELS is
    refused, naming `setting`, before anything is allocated."""
    if arr.ndim == 3 and arr.shape[2] == 4:
        arr = arr[:, :, :3]
    check_picture(arr, what, setting)
    height, width = int(arr.shape[0]), int(arr.shape[1])
    k = shrink_factor(width, height)
    if k == 1:
        return uint8_rgb(arr, what, setting)
    out = np.empty((-(-height // k), -(-width // k)) + arr.shape[2:], dtype=np.uint8)
    cols = min(out.shape[1], max(1, ROW_BLOCK_PIXELS // (k * min(k, height))))  # a tile's output columns
    rows = max(1, ROW_BLOCK_PIXELS // (k * k * cols))                             # and its output rows
    for top in range(0, out.shape[0], rows):
        for left in range(0, out.shape[1], cols):
            tile = _scaled(arr[top * k:(top + rows) * k, left * k:(left + cols) * k])
            sums = np.add.reduceat(np.add.reduceat(tile, np.arange(0, tile.shape[0], k), axis=0),
                                   np.arange(0, tile.shape[1], k), axis=1)
            counts = np.outer(_block_sizes(tile.shape[0], k), _block_sizes(tile.shape[1], k))
            sums /= counts.reshape(counts.shape + (1,) * (tile.ndim - 2))
            sums += 0.5
            out[top:top + sums.shape[0], left:left + sums.shape[1]] = sums
    return out


def _block_sizes(length: int, k: int) -> np.ndarray:
    """The lengths of the k-long blocks that cover `length`, the last one short where it does not divide."""
    sizes = np.full(-(-length // k), k, dtype=np.float32)
    sizes[-1] = length - k * (len(sizes) - 1)
    return sizes


def stretched(arr: np.ndarray, size: tuple[int, int], what: str, setting: str) -> Any:
    """The picture (as capped_uint8_rgb takes it) as the PIL image vLLM-Omni 0.30 hands the pipeline
    at `size` (width, height): its upload decoded as RGB, then Pillow LANCZOS to the request's size,
    aspect not kept, only where the size differs (serving_video.py:351-363). Made here from the same
    uint8 RGB picture a full-size upload would carry, so the server's stretch is skipped and its
    pixels are the ones it would have made itself (the same Pillow resampling on both sides)."""
    from PIL import Image  # noqa: PLC0415

    picture = Image.fromarray(capped_uint8_rgb(arr, what, setting))
    if picture.mode != "RGB":                  # grey: the server's decode converts it before its stretch
        picture = picture.convert("RGB")
    size = (int(size[0]), int(size[1]))
    return picture if picture.size == size else picture.resize(size, Image.Resampling.LANCZOS)


def image_to_png(image: Any, size: Optional[tuple[int, int]] = None, *, compress_level: int = 1) -> bytes:
    """One image as PNG bytes for the `input_reference` upload.

    Accepts [H, W, 3] (or [H, W, 4], alpha dropped; or [H, W] / [H, W, 1], grey) as
    float 0..1 or uint8, and ComfyUI's IMAGE batch shape [1, H, W, C]. A torch CPU
    tensor works too (anything `np.asarray` takes). Float values are clipped to 0..1.
    A picture over MAX_IMAGE_PIXELS is shrunk to within it, its aspect kept (capped_uint8_rgb).
    `size` (width, height): the request's, as models.request_for resolves it; the picture is then
    stretched to it as the server would (`stretched`), so a 12 MP photo goes up as an 832x480 PNG.
    Without it, the PNG keeps the picture's own size (what a full-size upload held: tests, bench).
    """
    arr = start_picture(image)
    if size is not None:
        picture = stretched(arr, size, "The start image", "image")
    else:
        from PIL import Image  # noqa: PLC0415

        picture = Image.fromarray(capped_uint8_rgb(arr, "The start image", "image"))
    buf = io.BytesIO()
    picture.save(buf, format="PNG", compress_level=compress_level)
    return buf.getvalue()


def start_picture(image: Any) -> np.ndarray:
    """The start image as one picture ([H, W, C] or [H, W]), refused for its shape, size or type before
    any pixel is converted (image_to_png's input; models.request_for checks it before converting any picture)."""
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
    check_picture(arr, "The start image", "image")
    return arr


__all__ = ["MAX_IMAGE_PIXELS", "MAX_INPUT_PIXELS", "capped_uint8_rgb", "check_picture", "image_to_png", "shrink_factor",
           "start_picture", "stretched", "uint8_rgb"]
