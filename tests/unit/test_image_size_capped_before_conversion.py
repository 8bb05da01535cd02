"""Start and reference images (client/images.py, client/media.py) are a stranger's input: one over
MAX_IMAGE_PIXELS is refused before it is converted, naming the input and Upscale Image; the conversion
to uint8 goes row block by row block (no full-size float copy), with the same pixels as one whole-array
conversion; an image within the cap converts as before."""
from __future__ import annotations

import io
import tracemalloc
from typing import Any, Callable

import numpy as np
import pytest
from PIL import Image

from pipeline_media import refused, smooth_frames
from vllm_omni_launcher.client import images, media
from vllm_omni_launcher.client.images import MAX_IMAGE_PIXELS, image_to_png


def peak_bytes(call: Callable[[], Any]) -> int:
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
    return np.broadcast_to(np.zeros((1, 1, 1, 3), np.float32), (batch, height, width, 3))


def test_the_cap_is_the_largest_size_the_widgets_allow():
    assert MAX_IMAGE_PIXELS == 4096 * 4096


def test_a_start_image_over_the_cap_is_refused_before_it_is_converted():
    image = huge(16384, 16384)
    assert peak_bytes(lambda: image_to_png(image)) < 1 << 20          # not the 768 MiB uint8 copy
    err = refused(lambda: image_to_png(image))
    assert err.what == "The start image is 16384x16384 (268.4 MP)" and err.setting == "image"
    assert "at most 16.8 MP" in err.why
    assert err.fix == "resize it to the video's size with ComfyUI's Upscale Image node before 'image'"
    assert refused(lambda: image_to_png(huge(4096, 4097))).setting == "image"        # one column over


def test_a_reference_image_over_the_cap_is_refused_naming_the_requests_size():
    err = refused(lambda: media.reference_images_from_batch(huge(8192, 4096, batch=2), 832, 480))
    assert err.what == "A reference image is 4096x8192 (33.6 MP)" and err.setting == "reference_images"
    assert err.fix == "resize it to 832x480 with ComfyUI's Upscale Image node before 'reference_images'"
    assert peak_bytes(lambda: media.reference_image(huge(8192, 4096), 832, 480)) < 1 << 20


def test_an_image_at_the_cap_still_converts():
    image = np.broadcast_to(np.zeros((1, 1, 3), np.uint8), (4096, 4096, 3))
    with Image.open(io.BytesIO(image_to_png(image))) as png:
        assert png.size == (4096, 4096)


def test_a_float_image_converts_without_full_size_float_copies():
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
    with Image.open(io.BytesIO(image_to_png(image))) as png:
        assert np.array_equal(np.asarray(png), whole)


@pytest.mark.parametrize("dtype", [object, "U3"])
def test_an_image_of_no_numbers_is_refused_naming_the_input(dtype):
    err = refused(lambda: media.reference_image(np.full((4, 4, 3), "a", dtype=dtype), 16, 16))
    assert "unsupported type" in err.what and err.setting == "reference_images"
