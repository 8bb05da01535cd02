"""The start image goes up already at the request's width x height, and the REAL vLLM-Omni 0.30 server
(server environment, no GPU) hands the pipeline the very pixels it would have made from the full-size
picture: its stretch (serving_video.py:351-363, Pillow LANCZOS, skipped when the size matches) and then the
pipeline's own pre-processing (I2V and TI2V resize again, S2V resizes the short side and centre-crops).

Each pair of bodies differs only in its `input_reference`: the PNG request_for makes, and the whole picture
as a PNG (what the launcher sent before). Both go through upstream's parser, handler and registered
pre-process hook (tests/contract/pipeline_form_probe.py), which answers with a digest of the image's pixels
at both points.
"""
from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from pipeline_form_probe import case, pixels_sha256
from vllm_omni_launcher.client import media
from vllm_omni_launcher.client.images import image_to_png
from vllm_omni_launcher.models import FAMILIES, PIPELINE_FAMILIES, request_for

I2V, TI2V, S2V = FAMILIES["i2v_a14b"], FAMILIES["ti2v_5b"], PIPELINE_FAMILIES["s2v_14b"]


def photo(height: int, width: int, grey: bool = False) -> np.ndarray:
    """A float picture with detail (gradients and grain) of another aspect than any request."""
    rng = np.random.default_rng(7)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    rgb = np.stack([0.5 + 0.5 * np.sin(x / 23 + y / 41), x / width, 0.5 + 0.5 * np.cos(y / 17)], -1)
    rgb += rng.standard_normal(rgb.shape, dtype=np.float32) * np.float32(0.04)
    return rgb[:, :, 1] if grey else rgb


# name: (family, the picture, the request's width and height: 0 is the model's)
PAIRS = {
    "i2v_default_size": (I2V, photo(900, 1200), (0, 0)),
    "i2v_grey_given_size": (I2V, photo(700, 500, grey=True), (640, 480)),
    "ti2v_default_size": (TI2V, photo(1000, 750), (0, 0)),
    "s2v_default_size": (S2V, photo(600, 1100), (0, 0)),
}


def _form(family, picture: np.ndarray, size: tuple[int, int]) -> dict:
    audio = media.audio_clip(np.sin(np.arange(16000 * 2) / 5.0)[None].astype(np.float32), 16000) \
        if family.pipeline == "s2v" else None
    return request_for(family, prompt="a face", width=size[0], height=size[1], image=picture, audio=audio).form_fields()


@pytest.fixture(scope="module")
def answers(upstream_resolver) -> dict:
    cases, sent = [], {}
    for name, (family, picture, size) in PAIRS.items():
        form = _form(family, picture, size)
        sent[name] = form
        whole = {**form, "input_reference": ("image.png", image_to_png(picture), "image/png")}
        cases += [case(f"{name}/sent", family, form), case(f"{name}/whole", family, whole)]
    answer, = upstream_resolver.resolve([{"call": "pipeline_form_probe:probe", "input": cases}], timeout=900)
    assert "call_error" not in answer, answer.get("call_error")
    return {"cases": answer["cases"], "sent": sent}


@pytest.mark.parametrize("name", list(PAIRS))
def test_the_start_image_goes_up_at_the_request_size(answers, name):
    form = answers["sent"][name]
    with Image.open(io.BytesIO(form["input_reference"][1])) as picture:
        assert picture.size == (int(form["width"]), int(form["height"]))
    family, _, size = PAIRS[name]
    assert picture.size == (size[0] or family.width, size[1] or family.height)


@pytest.mark.parametrize("name", list(PAIRS))
def test_upstream_makes_the_same_pixels_from_it_as_from_the_whole_picture(answers, name):
    sent, whole = answers["cases"][f"{name}/sent"], answers["cases"][f"{name}/whole"]
    assert sent["status"] == whole["status"] == 200, (sent, whole)
    assert sent["images"] == whole["images"] == [[int(answers["sent"][name]["width"]),
                                                  int(answers["sent"][name]["height"])]]
    assert sent["pixels_sha256"] == whole["pixels_sha256"]              # after serving_video's stretch
    assert "error" not in sent["pre_process"], sent["pre_process"]
    assert sent["pre_process"]["pixels_sha256"] == whole["pre_process"]["pixels_sha256"]   # after the pipeline's
    with Image.open(io.BytesIO(answers["sent"][name]["input_reference"][1])) as ours:
        assert sent["pixels_sha256"] == [pixels_sha256(ours.convert("RGB"))]   # the server kept our pixels as sent
