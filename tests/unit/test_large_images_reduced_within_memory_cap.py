"""Start and reference images (client/images.py, client/media.py) are a stranger's input, and a 24 MP phone
photo an ordinary one: a picture over MAX_IMAGE_PIXELS is not refused but shrunk to within it by k x k block
averages, tile by tile, so the launcher never allocates a full-size copy of it (uint8 or float); what the server
then makes of it (its LANCZOS stretch to the request's size) is what it makes of the whole photo, within a few
levels. NaN and inf are handled as in the conversion of a picture within the cap, which goes row block by row
block with the same pixels as one whole-array conversion. Only a picture past MAX_INPUT_PIXELS (far past any video)
is refused, before anything is allocated."""
from __future__ import annotations

import io
import tracemalloc
from typing import Any, Callable

import numpy as np
import pytest
from PIL import Image

from pipeline_media import refused, smooth_frames
from vllm_omni_launcher.client import images, media
from vllm_omni_launcher.client.images import MAX_IMAGE_PIXELS, MAX_INPUT_PIXELS, image_to_png
from vllm_omni_launcher.models import PIPELINE_FAMILIES, request_for

LANCZOS = Image.Resampling.LANCZOS


def peak_bytes(call: Callable[[], Any]) -> int:
    """The most memory Python objects (numpy arrays included) held during `call`, raised or not."""
    tracemalloc.start()
    try:
        call()
        return tracemalloc.get_traced_memory()[1]
    except Exception:
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def huge(height: int, width: int, batch: int = 1) -> np.ndarray:
    """A float IMAGE of that size with no memory behind it (as ComfyUI's Empty Image could send)."""
    return np.broadcast_to(np.full((1, 1, 1, 3), 0.3, np.float32), (batch, height, width, 3))


def phone_photo(height: int = 4000, width: int = 6000) -> np.ndarray:
    """A 24 MP float picture with detail: gradients, grain and one-pixel lines (275 MiB as float32)."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    photo = np.stack([0.5 + 0.5 * np.sin(x / 37 + y / 53), (x / width) ** 2, 0.5 + 0.5 * np.cos(y / 29)], -1)
    photo += np.random.default_rng(0).standard_normal(photo.shape, dtype=np.float32) * np.float32(0.05)
    photo[::97, :, 0] = 1.0
    return photo


def png_pixels(png: bytes) -> np.ndarray:
    with Image.open(io.BytesIO(png)) as picture:
        return np.asarray(picture)


def levels_apart(a: Any, b: Any) -> np.ndarray:
    return np.abs(np.asarray(a).astype(np.int16) - np.asarray(b).astype(np.int16))


@pytest.fixture(scope="module")
def photo() -> np.ndarray:
    return phone_photo()


@pytest.fixture(scope="module")
def sent_and_whole(photo) -> tuple[Image.Image, Image.Image]:
    """The start image upload's picture, and the whole photo as uint8 (what a full-size upload would hold)."""
    return (Image.fromarray(png_pixels(image_to_png(photo))),
            Image.fromarray(images.uint8_rgb(photo, "The start image", "image")))


def test_the_cap_is_the_largest_size_the_widgets_allow():
    assert MAX_IMAGE_PIXELS == 4096 * 4096


def test_a_phone_photo_start_image_becomes_a_box_average_within_the_cap(sent_and_whole):
    sent, whole = sent_and_whole
    assert sent.size == (3000, 2000)                                   # k = 2: 6 MP, the aspect kept
    apart = levels_apart(sent, whole.reduce(2))                        # Pillow's 2x2 box average of the uint8 photo
    assert apart.max() <= 1 and apart.mean() < 0.25                   # only the rounding of the uint8 step differs


@pytest.mark.parametrize("size", [(832, 480), (1280, 720), (480, 832)])
def test_the_servers_stretch_of_the_shrunk_photo_is_that_of_the_whole_photo(sent_and_whole, size):
    """vLLM-Omni stretches the start image to the request's width x height with Pillow's LANCZOS
    (serving_video.py:351-363 in 0.30; the Wan pipelines' pre-process again, a no-op at that size)."""
    sent, whole = sent_and_whole
    apart = levels_apart(sent.resize(size, LANCZOS), whole.resize(size, LANCZOS))
    # of 255 levels; the most where the box average softens the grain and the 1-px lines before LANCZOS
    assert apart.mean() < 1 and apart.max() <= 12


def test_a_phone_photo_reference_is_the_lanczos_stretch_of_the_whole_photo(photo, sent_and_whole):
    ref = media.reference_image(photo[None], 832, 480)
    whole = sent_and_whole[1]
    assert (ref.width, ref.height) == (832, 480)
    assert levels_apart(png_pixels(ref.jpeg), whole.resize((832, 480), LANCZOS)).mean() < 4      # JPEG q92


def test_shrinking_never_allocates_a_full_size_copy(photo):
    full_uint8 = photo.shape[0] * photo.shape[1] * 3                  # 69 MiB; the float32 input is 4x that
    assert peak_bytes(lambda: image_to_png(photo)) < full_uint8 / 2   # the 17 MiB result + one tile + the PNG
    assert peak_bytes(lambda: media.reference_image(photo, 832, 480)) < full_uint8 / 2
    as_uint8 = np.ascontiguousarray(np.broadcast_to(np.uint8(77), photo.shape))
    assert peak_bytes(lambda: image_to_png(as_uint8)) < full_uint8 / 2
    empty_image = huge(16384, 16384)                                  # ComfyUI's largest Empty Image: 3 GiB
    sent: list[bytes] = []
    assert peak_bytes(lambda: sent.append(image_to_png(empty_image))) < 4096 * 4096 * 3 * 1.25  # 48 MiB result
    assert png_pixels(sent[0]).shape == (4096, 4096, 3)


def test_references_over_the_cap_are_taken():
    refs = request_for(PIPELINE_FAMILIES["vace_1_3b"], prompt="x", reference_images=huge(8192, 4096, batch=2),
                       width=832, height=480).reference_images
    assert [(r.width, r.height) for r in refs] == [(832, 480)] * 2
    assert abs(int(png_pixels(refs[0].jpeg).mean()) - 77) <= 1        # 0.3 of 255


@pytest.mark.parametrize("width,height", [(4096, 4096), (4097, 4096), (6000, 4000), (8193, 8191), (16384, 16384),
                                          (1, MAX_INPUT_PIXELS), (100_000, 3)])
def test_the_shrink_factor_is_the_smallest_that_fits_the_cap(width, height):
    def fits(k: int) -> bool:
        return -(-width // k) * -(-height // k) <= MAX_IMAGE_PIXELS

    k = images.shrink_factor(width, height)
    assert fits(k) and (k == 1 or not fits(k - 1))


def test_block_averages_clip_and_zero_nan_like_the_whole_conversion(monkeypatch):
    monkeypatch.setattr(images, "MAX_IMAGE_PIXELS", 120)             # 37x23 -> k = 3: 13x8, short edge blocks
    monkeypatch.setattr(images, "ROW_BLOCK_PIXELS", 40)              # tiles of 3x12 inputs, many, the last short
    rng = np.random.default_rng(1)
    image = rng.uniform(-0.5, 1.5, (37, 23, 4)).astype(np.float32)
    image[0:3, 0:3, 0], image[0:3, 3:6, 1], image[3:6, 0:3, 2] = np.nan, np.inf, -np.inf     # whole blocks
    image[4, 4, 0], image[7, 7, 1], image[10, 10, 2] = np.nan, np.inf, -np.inf                 # one pixel of a block
    with np.errstate(invalid="ignore"):
        levels = np.nan_to_num(np.clip(image[:, :, :3].astype(np.float64) * 255, 0, 255), nan=0.0)
    expected = np.array([[levels[r:r + 3, c:c + 3].mean(axis=(0, 1)) + 0.5 for c in range(0, 23, 3)]
                         for r in range(0, 37, 3)]).astype(np.uint8)
    got = images.capped_uint8_rgb(image, "The start image", "image")
    assert got.shape == (13, 8, 3) and levels_apart(got, expected).max() <= 1         # float32 vs float64 sums
    assert got[0, 0, 0] == 0 and got[0, 1, 1] == 255 and got[1, 0, 2] == 0           # NaN, inf, -inf blocks
    grey = rng.integers(-300, 600, (37, 23))
    grey_levels = np.clip(grey, 0, 255).astype(np.float64)
    expected_grey = np.array([[grey_levels[r:r + 3, c:c + 3].mean() + 0.5 for c in range(0, 23, 3)]
                              for r in range(0, 37, 3)]).astype(np.uint8)
    assert np.array_equal(images.capped_uint8_rgb(grey, "x", "image"), expected_grey)


def test_a_picture_past_any_video_is_refused_before_anything_is_allocated():
    image = huge(32768, 32769)
    assert peak_bytes(lambda: image_to_png(image)) < 1 << 20
    err = refused(lambda: image_to_png(image))
    assert err.what == "The start image is 32769x32768 (1073.8 MP)" and err.setting == "image"
    assert err.fix == "resize it with ComfyUI's Upscale Image node before 'image'"
    assert refused(lambda: media.reference_image(image, 832, 480)).setting == "reference_images"


def test_an_image_at_the_cap_converts_at_its_own_size_and_one_pixel_over_is_halved():
    at_cap = np.broadcast_to(np.zeros((1, 1, 3), np.uint8), (4096, 4096, 3))
    assert png_pixels(image_to_png(at_cap)).shape == (4096, 4096, 3)
    over = np.broadcast_to(np.zeros((1, 1, 3), np.uint8), (4096, 4097, 3))
    assert png_pixels(image_to_png(over)).shape == (2048, 2049, 3)


def test_a_float_image_within_the_cap_converts_without_full_size_float_copies():
    image = smooth_frames(1, 1024, 2048)[0]                # 24 MiB of float32
    assert peak_bytes(lambda: image_to_png(image)) < image.nbytes * 0.75      # uint8 copy + one block + the PNG
    assert peak_bytes(lambda: media.reference_image(image, 832, 480)) < image.nbytes * 0.75


def test_block_conversion_gives_the_whole_array_conversions_pixels(monkeypatch):
    rng = np.random.default_rng(0)
    image = rng.uniform(-0.5, 1.5, (37, 23, 4)).astype(np.float32)
    image[0, 0, 0], image[1, 1, 1], image[2, 2, 2] = np.nan, np.inf, -np.inf
    with np.errstate(over="ignore"):                         # the old whole-array formula, inf included
        whole = np.clip(np.nan_to_num(image[:, :, :3]) * 255.0 + 0.5, 0, 255).astype(np.uint8)
    monkeypatch.setattr(images, "ROW_BLOCK_PIXELS", 50)       # blocks of 2 rows, the last one short
    assert np.array_equal(images.uint8_rgb(image, "The start image", "image"), whole)
    ints = rng.integers(-300, 300, (5, 7, 3))
    assert np.array_equal(images.uint8_rgb(ints, "x", "image"), np.clip(ints, 0, 255).astype(np.uint8))
    assert np.array_equal(png_pixels(image_to_png(image)), whole)


@pytest.mark.parametrize("dtype", [object, "U3"])
def test_an_image_of_no_numbers_is_refused_naming_the_input(dtype):
    err = refused(lambda: media.reference_image(np.full((4, 4, 3), "a", dtype=dtype), 16, 16))
    assert "unsupported type" in err.what and err.setting == "reference_images"
    big = np.broadcast_to(np.array("a", dtype=dtype), (4097, 4096, 3))
    assert "unsupported type" in refused(lambda: image_to_png(big)).what
