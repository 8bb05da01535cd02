"""The start image (I2V, TI2V, S2V) goes up as a PNG at the request's width x height, the size request_for
resolves (0 / None: the model's, or the serving plan's where the node's widgets ask for the model's): Pillow
LANCZOS of the same uint8 RGB picture a full-size upload would carry, as vLLM-Omni would stretch it itself
(serving_video.py:351-363; tests/contract/test_start_image_sent_at_request_size_upstream.py runs the server's
code on both). A picture over images.MAX_IMAGE_PIXELS is block-averaged first, as before. The node and the CLI's
--image both go through request_for, and every check of the picture still refuses before anything is sent."""
from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from pipeline_media import refused
from vllm_omni_launcher.cli import build_parser, generate_cmd
from vllm_omni_launcher.client import images
from vllm_omni_launcher.models import FAMILIES, PIPELINE_FAMILIES, request_for
from vllm_omni_launcher.nodes import session
from vllm_omni_launcher.nodes.handles import ServerHandle
from vllm_omni_launcher.planner.launch_plan import RequestLimit

I2V, TI2V, S2V = FAMILIES["i2v_a14b"], FAMILIES["ti2v_5b"], PIPELINE_FAMILIES["s2v_14b"]
LANCZOS = Image.Resampling.LANCZOS


def photo(height: int = 750, width: int = 1000) -> np.ndarray:
    """A float picture with gradients and grain, of another aspect than any request."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    rgb = np.stack([0.5 + 0.5 * np.sin(x / 23 + y / 41), x / width, 0.5 + 0.5 * np.cos(y / 17)], -1)
    return rgb + np.random.default_rng(3).standard_normal(rgb.shape, dtype=np.float32) * np.float32(0.04)


def sent(request) -> np.ndarray:
    """The pixels of the request's start image upload, as the server decodes them (RGB)."""
    with Image.open(io.BytesIO(request.form_fields()["input_reference"][1])) as picture:
        return np.asarray(picture.convert("RGB"))


def lanczos(picture: np.ndarray, width: int, height: int) -> np.ndarray:
    """What vLLM-Omni makes of the full-size upload of `picture` (uint8 RGB)."""
    return np.asarray(Image.fromarray(picture).resize((width, height), LANCZOS))


@pytest.mark.parametrize("family, asked, size", [
    (I2V, (0, 0), (832, 480)),            # the model's size (the node's 0)
    (I2V, (None, None), (832, 480)),      # the CLI's option left out
    (TI2V, (0, 0), (1280, 704)),
    (I2V, (640, 352), (640, 352)),
    (TI2V, (0, 480), (1280, 480)),        # one side the model's
])
def test_the_start_image_png_has_the_request_size(family, asked, size):
    request = request_for(family, prompt="a fox", width=asked[0], height=asked[1], image=photo())
    assert (request.width, request.height) == size
    assert sent(request).shape == (size[1], size[0], 3)


def test_its_pixels_are_pil_lanczos_of_the_uint8_picture_float_or_uint8():
    picture = photo()
    whole = images.uint8_rgb(picture, "The start image", "image")
    expected = lanczos(whole, 832, 480)
    assert np.array_equal(sent(request_for(I2V, prompt="x", image=picture)), expected)
    assert np.array_equal(sent(request_for(I2V, prompt="x", image=whole)), expected)
    assert np.array_equal(sent(request_for(I2V, prompt="x", image=picture[None])), expected)   # IMAGE [1, H, W, 3]
    rgba = np.concatenate([whole, np.full(whole.shape[:2] + (1,), 9, np.uint8)], -1)
    assert np.array_equal(sent(request_for(I2V, prompt="x", image=rgba)), expected)           # alpha dropped


def test_a_grey_picture_is_stretched_as_the_server_stretches_its_rgb_decode():
    grey = images.uint8_rgb(photo()[:, :, 0], "The start image", "image")
    expected = lanczos(np.asarray(Image.fromarray(grey).convert("RGB")), 832, 480)
    assert np.array_equal(sent(request_for(I2V, prompt="x", image=grey)), expected)
    assert np.array_equal(sent(request_for(I2V, prompt="x", image=grey[:, :, None])), expected)


def test_a_picture_already_at_the_request_size_goes_up_untouched():
    picture = images.uint8_rgb(photo(480, 832), "The start image", "image")
    assert np.array_equal(sent(request_for(I2V, prompt="x", image=picture)), picture)


def test_a_picture_over_the_cap_is_block_averaged_first_then_stretched():
    big = np.random.default_rng(5).integers(0, 256, (4100, 4100, 3), dtype=np.uint8)    # over 4096x4096
    shrunk = images.capped_uint8_rgb(big, "The start image", "image")
    assert shrunk.shape == (2050, 2050, 3)
    assert np.array_equal(sent(request_for(TI2V, prompt="x", image=big)), lanczos(shrunk, 1280, 704))


def test_the_checks_of_the_picture_still_refuse_naming_the_image():
    assert "batch of 2" in refused(lambda: request_for(I2V, prompt="x", image=np.zeros((2, 8, 8, 3)))).what
    assert refused(lambda: request_for(I2V, prompt="x", image=np.zeros((8, 8, 5)))).setting == "image"
    assert refused(lambda: request_for(I2V, prompt="x", image=np.zeros((8, 8, 3), "U1"))).setting == "image"
    nan = np.full((48, 64, 3), np.nan, np.float32)           # at the request's size: sent as converted
    nan[0, 0] = np.inf
    expected = np.zeros((48, 64, 3), np.uint8)
    expected[0, 0] = 255                                       # NaN as 0, inf clipped to 255
    assert np.array_equal(sent(request_for(I2V, prompt="x", width=64, height=48, image=nan)), expected)


def test_a_refused_request_refuses_before_the_picture_is_converted():
    # a batch of two would be refused as the image; the width is checked first
    assert refused(lambda: request_for(I2V, prompt="x", width=100, image=np.zeros((2, 8, 8, 3)))).setting == "width"


def test_the_node_sends_it_at_the_serving_plans_size_where_the_widgets_ask_for_the_models():
    handle = ServerHandle("remote", "http://127.0.0.1:1", I2V.hf_id, I2V.key)
    request, _ = session.build_request(handle, image=photo()[None], prompt="a fox", width=0, height=0)
    assert sent(request).shape == (480, 832, 3)
    limited = ServerHandle("remote", "http://127.0.0.1:1", I2V.hf_id, I2V.key, limit=RequestLimit(640, 352, 41, "x"))
    request, _ = session.build_request(limited, image=photo()[None], prompt="a fox", width=0, height=0)
    assert (request.width, request.height) == (640, 352) and sent(request).shape == (352, 640, 3)


def test_the_cli_image_goes_through_the_same_resize(tmp_path):
    picture = images.uint8_rgb(photo(), "The start image", "image")
    Image.fromarray(picture).save(tmp_path / "face.png")
    args = build_parser("generate").parse_args(["--prompt", "x", "--image", str(tmp_path / "face.png"),
                                                "--width", "640", "--height", "352"])
    request = generate_cmd._request(args, I2V, generate_cmd._checked_image(args, I2V))
    assert np.array_equal(sent(request), lanczos(picture, 640, 352))
