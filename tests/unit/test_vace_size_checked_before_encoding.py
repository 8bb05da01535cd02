"""Generate VACE Video checks the request's width and height by the model's own rule (models.check_request)
before it encodes the control video or the reference images (those in models.request_for): a control video of
a size H.264 or the model cannot take gets the launcher's message naming the control video (width/height 0
take its size) or the widget that was set, never PyAV's encoder error; a size the model takes is encoded and
sent as before."""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from comfy_standin import run_node
from pipeline_media import Sent, jobs_stopped_before_sending, refused, smooth_frames  # noqa: F401 (a fixture)
from vllm_omni_launcher.client import media
from vllm_omni_launcher.models import PIPELINE_FAMILIES
from vllm_omni_launcher.nodes.handles import ServerHandle

VACE = PIPELINE_FAMILIES["vace_1_3b"]


@pytest.fixture()
def encoded(monkeypatch, jobs_stopped_before_sending) -> list[str]:
    """Records every encode of a control video or a reference image (the job is stopped before it is sent)."""
    calls: list[str] = []
    real_video, real_ref = media.control_video_from_frames, media.reference_image
    monkeypatch.setattr(media, "control_video_from_frames",
                        lambda *a, **k: calls.append("control_video") or real_video(*a, **k))
    monkeypatch.setattr(media, "reference_image", lambda *a, **k: calls.append("reference_image") or real_ref(*a, **k))
    return calls


def vace(**values: Any) -> None:
    widgets = {"prompt": "a dancer", "negative_prompt": "", "width": 0, "height": 0, "frames": 0, "steps": 0,
               "guidance": -1.0, "seed": 0}
    server = ServerHandle("remote", "http://gpu-box:8091", VACE.hf_id, VACE.key)
    with pytest.raises(Sent):
        run_node("VLLMOmniGenerateVACE", server=server, **{**widgets, **values})


@pytest.mark.parametrize("shape", [(5, 17, 17, 3), (5, 15, 32, 3), (5, 32, 24, 3)])
def test_a_control_video_of_a_size_the_model_cannot_take_is_refused_before_encoding(encoded, shape):
    err = refused(lambda: vace(control_video=np.zeros(shape, np.float32)))
    height, width = shape[1:3]
    assert err.what.startswith(f"The control video is {width}x{height}: its ")
    assert "is not valid for Wan2.1 VACE-1.3B" in err.what and "must be a multiple of 16" in err.why
    assert "is 0, so the request takes the control video's" in err.why
    assert "Upscale Image" in err.fix and "multiples of 16" in err.fix and err.setting == "control_video"
    assert encoded == []


def test_a_width_widget_the_model_cannot_take_names_the_widget(encoded):
    err = refused(lambda: vace(width=17, height=32, control_video=np.zeros((5, 32, 17, 3), np.float32)))
    assert err.what == "width 17 is not valid for Wan2.1 VACE-1.3B" and err.setting == "width"
    assert err.fix == "set width to 16 or 32" and encoded == []


def test_reference_images_are_not_encoded_for_a_size_the_model_cannot_take(encoded):
    err = refused(lambda: vace(width=840, height=480, reference_images=smooth_frames(1, 64, 64)))
    assert err.what == "width 840 is not valid for Wan2.1 VACE-1.3B" and err.setting == "width"
    assert encoded == []


def test_a_control_video_of_a_size_the_model_takes_is_encoded_and_sent(encoded, jobs_stopped_before_sending):
    vace(control_video=smooth_frames(5, 32, 48))
    assert encoded == ["control_video"]
    (sent,) = jobs_stopped_before_sending
    assert (sent.width, sent.height, sent.num_frames) == (48, 32, 5)
    assert (sent.control_video.width, sent.control_video.height, sent.control_video.frames) == (48, 32, 5)


def test_reference_images_of_a_size_the_model_takes_are_encoded_once_each_and_sent(encoded,
                                                                                    jobs_stopped_before_sending):
    vace(width=320, height=192, reference_images=smooth_frames(2, 64, 48))
    (sent,) = jobs_stopped_before_sending
    assert encoded == ["reference_image"] * 2
    assert [(ref.width, ref.height) for ref in sent.reference_images] == [(320, 192)] * 2
