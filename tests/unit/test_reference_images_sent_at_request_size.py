"""VACE reference images are made in one place, models.request_for, at the width x height it resolves (0 / None:
the model's, or the serving plan's where the node's widgets ask for the model's), as it makes the start image:
the node and the CLI pass the pictures as given, so the same picture at the same size gives the same bytes
whichever surface sent it. Every picture is checked (count, shape, size, type) before any is encoded, and the
refusals keep their words."""
from __future__ import annotations

import io
from typing import Any

import numpy as np
import pytest
from PIL import Image

from comfy_standin import run_node
from pipeline_media import Sent, jobs_stopped_before_sending, refused, smooth_frames  # noqa: F401 (a fixture)
from vllm_omni_launcher.cli import build_parser, generate_cmd
from vllm_omni_launcher.client import media
from vllm_omni_launcher.client.images import MAX_INPUT_PIXELS
from vllm_omni_launcher.models import PIPELINE_FAMILIES, request_for
from vllm_omni_launcher.nodes.handles import ServerHandle
from vllm_omni_launcher.planner.launch_plan import RequestLimit

VACE, VACE_SMALL = PIPELINE_FAMILIES["vace_14b"], PIPELINE_FAMILIES["vace_1_3b"]


def jpeg_size(ref: media.ReferenceImage) -> tuple[int, int]:
    with Image.open(io.BytesIO(ref.jpeg)) as picture:
        return picture.size


@pytest.fixture()
def encoded(monkeypatch) -> list[tuple[int, int]]:
    """The size of every reference image encoded (media.reference_image, the one encoder of them)."""
    sizes: list[tuple[int, int]] = []
    real = media.reference_image
    monkeypatch.setattr(media, "reference_image", lambda image, width, height: sizes.append((width, height))
                        or real(image, width, height))
    return sizes


@pytest.mark.parametrize("family, asked, size", [
    (VACE_SMALL, (0, 0), (VACE_SMALL.width, VACE_SMALL.height)),      # the model's size (the node's 0)
    (VACE, (None, None), (VACE.width, VACE.height)),                  # the CLI's option left out
    (VACE_SMALL, (640, 352), (640, 352)),
    (VACE_SMALL, (640, 0), (640, VACE_SMALL.height)),                 # one side the model's
])
def test_reference_images_are_made_at_the_size_request_for_resolves(encoded, family, asked, size):
    pictures = smooth_frames(2, 300, 200)
    request = request_for(family, prompt="a cat", width=asked[0], height=asked[1], reference_images=pictures)
    assert (request.width, request.height) == size and encoded == [size, size]
    assert [(ref.width, ref.height) for ref in request.reference_images] == [size, size]
    assert [jpeg_size(ref) for ref in request.reference_images] == [size, size]
    assert [ref.jpeg for ref in request.reference_images] == [media.reference_image(p, *size).jpeg for p in pictures]


def test_one_picture_and_a_sequence_of_pictures_are_taken_as_a_batch_is():
    batch = smooth_frames(2, 64, 48)
    sent = [request_for(VACE_SMALL, prompt="x", reference_images=given).reference_images
            for given in (batch, list(batch), (batch[0][None], batch[1]))]
    assert [ref.jpeg for ref in sent[0]] == [ref.jpeg for ref in sent[1]] == [ref.jpeg for ref in sent[2]]
    (one,) = request_for(VACE_SMALL, prompt="x", reference_images=batch[0]).reference_images
    assert one.jpeg == sent[0][0].jpeg


def node_request(handle: ServerHandle, **widgets: Any) -> Any:
    """The request Generate VACE Video makes for these widgets (jobs_stopped_before_sending: nothing is sent)."""
    values = {"prompt": "a cat", "negative_prompt": "", "width": 0, "height": 0, "frames": 0, "steps": 0,
              "guidance": -1.0, "seed": 0, **widgets}
    with pytest.raises(Sent):
        run_node("VLLMOmniGenerateVACE", server=handle, **values)


def handle(limit: Any = None) -> ServerHandle:
    """A VACE-1.3B server's handle (`limit`: its serving plan's, as Local Server gives it)."""
    return ServerHandle("remote", "http://127.0.0.1:1", VACE_SMALL.hf_id, VACE_SMALL.key, limit=limit)


def test_the_node_and_the_cli_send_the_same_reference_bytes(jobs_stopped_before_sending, tmp_path):
    pictures = (smooth_frames(2, 300, 200) * 255 + 0.5).astype(np.uint8)
    for i, picture in enumerate(pictures):
        Image.fromarray(picture).save(tmp_path / f"ref{i}.png")
    for width, height in ((0, 0), (640, 352)):
        node_request(handle(), width=width, height=height,
                     reference_images=pictures.astype(np.float32) / 255)       # a ComfyUI IMAGE batch
        node = jobs_stopped_before_sending[-1]
        sizes = ["--width", str(width), "--height", str(height)] if width else []
        refs = [arg for i in range(2) for arg in ("--reference-image", str(tmp_path / f"ref{i}.png"))]
        args = build_parser("generate").parse_args(["--prompt", "a cat", *refs, *sizes])
        cli = generate_cmd._request(args, VACE_SMALL, None)
        assert (node.width, node.height) == (cli.width, cli.height) == ((width, height) if width else (832, 480))
        assert [ref.jpeg for ref in node.reference_images] == [ref.jpeg for ref in cli.reference_images]
        assert len(node.reference_images) == 2


def test_the_node_makes_them_at_the_serving_plans_size_where_the_widgets_ask_for_the_models(
        jobs_stopped_before_sending):
    limited = handle(RequestLimit(640, 352, 41, "the serving plan fits 640x352x41"))
    node_request(limited, reference_images=smooth_frames(1, 300, 200))
    (request,) = jobs_stopped_before_sending
    assert (request.width, request.height) == (640, 352)
    assert [jpeg_size(ref) for ref in request.reference_images] == [(640, 352)]


# ----------------------------------------------------------------------------- refusals, before any encode
def test_more_than_four_are_refused_by_count_before_any_is_looked_at(encoded):
    many = np.broadcast_to(np.zeros((1, 1, 1, 3), np.float32), (5, 4000, 4000, 3))    # no memory behind it
    err = refused(lambda: request_for(VACE_SMALL, prompt="x", reference_images=many))
    assert (err.what, err.setting) == ("5 reference images were given", "reference_images")
    assert err.fix == f"pass at most {media.MAX_REFERENCE_IMAGES} images as reference_images" and encoded == []


def test_a_bad_shape_is_refused_before_any_reference_is_encoded(encoded):
    good, bad = smooth_frames(1, 64, 48)[0], np.zeros((8, 8, 5), np.float32)
    err = refused(lambda: request_for(VACE_SMALL, prompt="x", reference_images=(good, bad)))
    assert (err.what, err.setting) == ("A reference image has shape (8, 8, 5)", "reference_images")
    assert err.fix == "connect an IMAGE (e.g. Load Image) to 'reference_images'" and encoded == []


def test_a_picture_past_the_input_cap_or_not_of_numbers_is_refused_before_any_is_encoded(encoded):
    good = smooth_frames(1, 64, 48)[0]
    vast = np.broadcast_to(np.zeros((1, 1, 3), np.float32), (MAX_INPUT_PIXELS // 4 + 1, 4, 3))
    err = refused(lambda: request_for(VACE_SMALL, prompt="x", reference_images=(good, vast)))
    assert err.what.startswith("A reference image is 4x") and err.setting == "reference_images"
    text = np.full((4, 4, 3), "a", dtype="U1")
    err = refused(lambda: request_for(VACE_SMALL, prompt="x", reference_images=(good, text)))
    assert err.what == "A reference image has unsupported type <U1" and encoded == []


def test_the_requests_own_refusals_come_before_the_pictures_are_looked_at(encoded):
    err = refused(lambda: request_for(VACE_SMALL, prompt="x", width=840, reference_images=np.zeros((8, 8, 5))))
    assert (err.what, err.setting) == ("width 840 is not valid for Wan2.1 VACE-1.3B", "width") and encoded == []
