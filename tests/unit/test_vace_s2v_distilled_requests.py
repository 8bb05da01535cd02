"""VACE, speech-to-video and step-distilled requests: their media checked and bounded before anything is
sent, and the form fields each family takes (docs/wan-pipelines.md). The form these requests make is read
back by the real 0.30 parser in tests/contract/test_pipeline_forms.py; recognition and launch are
test_pipeline_families.py's, the CLI's and nodes' refusals test_pipeline_inputs_refused.py's."""
from __future__ import annotations

import base64
import io
import json
import wave

import numpy as np
import pytest

from pipeline_media import portrait, refused, smooth_frames
from vllm_omni_launcher.client import media
from vllm_omni_launcher.client.frames import decode_mp4
from vllm_omni_launcher.errors import LauncherError
from vllm_omni_launcher.models import FAMILIES, PIPELINE_FAMILIES, request_for

VACE, VACE_SMALL = PIPELINE_FAMILIES["vace_14b"], PIPELINE_FAMILIES["vace_1_3b"]
S2V, FAST = PIPELINE_FAMILIES["s2v_14b"], PIPELINE_FAMILIES["fastwan_ti2v_5b"]


# ----------------------------------------------------------------------------- VACE
def test_a_control_video_goes_as_an_mp4_upload_that_decodes_to_its_frames():
    clip = media.control_video_from_frames(smooth_frames(17, 480, 832))
    request = request_for(VACE, prompt="a dancer", frames=17, control_video=clip)
    name, data, mime = request.form_fields()["input_reference"]
    assert (name, mime) == ("control.mp4", "video/mp4")
    decoded = decode_mp4(data)
    assert decoded.frames.shape == (17, 480, 832, 3)
    assert np.abs(decoded.frames - smooth_frames(17, 480, 832)).mean() < 0.02      # near-lossless


def test_a_control_video_of_another_frame_count_is_refused_before_sending():
    clip = media.control_video_from_frames(smooth_frames(21, 480, 832))
    err = refused(lambda: request_for(VACE, prompt="a dancer", frames=17, control_video=clip))
    assert err.what == "The control video has 21 frames, the request 17" and err.setting == "control_video"


def test_a_control_video_of_another_size_is_refused_before_sending():
    clip = media.control_video_from_frames(smooth_frames(17, 480, 640))
    err = refused(lambda: request_for(VACE, prompt="a dancer", frames=17, control_video=clip))
    assert err.what == "The control video is 640x480, the request 832x480" and "832x480" in err.fix


def test_an_oversized_control_batch_is_refused_from_its_shape_without_encoding():
    huge = np.broadcast_to(np.zeros((1, 1, 1, 3), np.uint8), (1000, 2160, 3840, 3))   # no memory behind it
    err = refused(lambda: media.control_video_from_frames(huge))
    assert "3840x2160 with 1000 frames" in err.what and err.setting == "control_video"


def test_a_control_mp4_file_is_checked_from_its_header(tmp_path):
    path = tmp_path / "pose.mp4"
    path.write_bytes(media.control_video_from_frames(smooth_frames(9, 480, 832)).mp4)
    clip = media.control_video_from_mp4(str(path))
    assert (clip.frames, clip.width, clip.height) == (9, 832, 480)
    (tmp_path / "notes.mp4").write_text("not a video")
    err = refused(lambda: media.control_video_from_mp4(str(tmp_path / "notes.mp4")))
    assert err.what.endswith("is not an H.264 MP4 the launcher can send") and "libx264" in err.fix


def test_several_references_go_as_one_image_reference_list_at_the_request_size():
    form = request_for(VACE_SMALL, prompt="a cat", reference_images=smooth_frames(3, 300, 200)).form_fields((0, 30))
    items = json.loads(form["image_reference"])
    assert len(items) == 3 and "input_reference" not in form
    from PIL import Image
    with Image.open(io.BytesIO(base64.b64decode(items[0]["image_url"].split(",", 1)[1]))) as img:
        assert img.size == (832, 480)


def test_one_reference_is_an_upload_and_several_need_0_30():
    one = smooth_frames(1, 480, 832)
    assert request_for(VACE, prompt="a cat", reference_images=one).form_fields((0, 26))["input_reference"][2] == \
        "image/jpeg"
    two = smooth_frames(2, 480, 832)
    err = refused(lambda: request_for(VACE, prompt="a cat", reference_images=two).form_fields((0, 26)))
    assert err.what == "2 reference images need vLLM-Omni 0.30"


def test_more_than_four_references_are_refused_before_any_is_encoded():
    many = np.broadcast_to(np.zeros((1, 1, 1, 3), np.float32), (5, 4000, 4000, 3))
    assert refused(lambda: request_for(VACE, prompt="a cat", reference_images=many)).what == \
        "5 reference images were given"


def test_references_and_a_control_video_together_are_refused_as_upstream_would():
    clip = media.control_video_from_frames(smooth_frames(17, 480, 832))
    refs = request_for(VACE, prompt="x", reference_images=smooth_frames(1, 480, 832)).reference_images
    request = request_for(VACE, prompt="x", frames=17, control_video=clip)
    request.reference_images = refs
    err = refused(request.form_fields)
    assert err.what == "The request has both control_video and reference_images"


def test_vace_sends_no_flow_shift_it_would_ignore():
    form = request_for(VACE, prompt="x").form_fields()
    assert "flow_shift" not in form and form["num_inference_steps"] == "50"


def test_media_a_family_cannot_take_is_refused_with_the_input_name():
    clip = media.control_video_from_frames(smooth_frames(81, 480, 832))
    err = refused(lambda: request_for(FAMILIES["t2v_a14b"], prompt="x", control_video=clip))
    assert err.setting == "control_video" and err.what == "Wan2.2 T2V-A14B does not take control_video"


# ----------------------------------------------------------------------------- S2V
def _speech(seconds: float, rate: int = 44100) -> media.AudioClip:
    t = np.arange(int(seconds * rate)) / rate
    return media.audio_clip(np.stack([np.sin(2 * np.pi * 220 * t)] * 2)[None].astype(np.float32), rate)


def test_s2v_audio_goes_as_a_16khz_mono_wav_data_url_under_one_mebibyte():
    form = request_for(S2V, prompt="a singer", image=portrait(), audio=_speech(7.0)).form_fields()
    url = json.loads(form["audio_reference"])["audio_url"]
    assert url.startswith("data:audio/wav;base64,") and len(form["audio_reference"]) <= media.FORM_TEXT_PART_MAX
    with wave.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1]))) as reader:
        assert (reader.getnchannels(), reader.getframerate(), reader.getnframes()) == (1, 16000, 112000)
    assert form["num_frames"] == "80" and form["fps"] == "16" and "flow_shift" not in form


def test_the_longest_allowed_audio_still_fits_the_form_part():
    assert len(_speech(media.MAX_AUDIO_S, 16000).form_value()) <= media.FORM_TEXT_PART_MAX


def test_audio_too_long_is_refused_from_its_shape_before_conversion():
    long = np.broadcast_to(np.zeros((1, 1), np.float32), (2, 48000 * 600))
    err = refused(lambda: media.audio_clip(long, 48000))
    assert err.what == "The audio is 600.0 s long" and err.setting == "audio"


def test_s2v_without_audio_or_image_is_refused():
    assert refused(lambda: request_for(S2V, prompt="x", image=portrait())).setting == "audio"
    assert refused(lambda: request_for(S2V, prompt="x", audio=_speech(2.0))).setting == "image"


def test_s2v_frames_are_per_clip_and_the_clip_length_follows_the_audio():
    request = request_for(S2V, prompt="x", image=portrait(), audio=_speech(7.0))   # 112 frames of audio
    bounds = request.bounds()
    assert bounds.min_frames <= 2 * 80 - 3 <= bounds.max_frames                      # two 80-frame clips
    bounds.check(832, 448, 157)
    with pytest.raises(LauncherError):
        bounds.check(832, 448, 400)
    assert refused(lambda: request_for(S2V, prompt="x", frames=81, image=portrait(), audio=_speech(2.0))).fix \
        == "set frames to 80"


def test_s2v_refuses_another_fps_that_would_desync_the_audio():
    err = refused(lambda: request_for(S2V, prompt="x", fps=24, image=portrait(), audio=_speech(2.0)))
    assert err.setting == "fps" and "16" in err.fix


def test_a_wav_file_is_read_through_its_header(tmp_path):
    path = tmp_path / "speech.wav"
    with wave.open(str(path), "wb") as writer:
        writer.setnchannels(2)
        writer.setsampwidth(2)
        writer.setframerate(22050)
        writer.writeframes(np.zeros((22050 * 3, 2), "<i2").tobytes())
    assert media.audio_clip_from_wav(str(path)).seconds == 3.0
    (tmp_path / "long.wav").write_bytes(b"")
    with wave.open(str(tmp_path / "long.wav"), "wb") as writer:
        writer.setnchannels(1)
        writer.setsampwidth(2)
        writer.setframerate(8000)
        writer.writeframes(np.zeros(8000 * 25, "<i2").tobytes())
    assert refused(lambda: media.audio_clip_from_wav(str(tmp_path / "long.wav"))).what == "The audio is 25.0 s long"


# ----------------------------------------------------------------------------- step-distilled
def test_fastwan_sends_the_steps_and_guidance_it_runs_and_no_flow_shift():
    form = request_for(FAST, prompt="x").form_fields()
    assert (form["num_inference_steps"], form["guidance_scale"]) == ("3", "1.0") and "flow_shift" not in form
    assert (form["width"], form["height"], form["num_frames"]) == ("1280", "704", "121")


def test_the_launch_plan_learns_each_family_cfg_without_its_media():
    from vllm_omni_launcher.models import guidance_as_sent
    from vllm_omni_launcher.planner.speed_costs import cfg_runs

    assert not cfg_runs(*guidance_as_sent(FAST))                 # distilled: no negative branch
    assert cfg_runs(*guidance_as_sent(S2V)) and cfg_runs(*guidance_as_sent(VACE, -1.0))
    assert guidance_as_sent(FAMILIES["t2v_a14b"], None, 1.0) == (4.0, 1.0)


def test_fastwan_refuses_an_explicit_step_count_the_server_would_drop():
    err = refused(lambda: request_for(FAST, prompt="x", steps=8))
    assert err.what == "FastWan2.2 TI2V-5B (3 steps) runs 3 as steps, not 8" and err.setting == "steps"
    request_for(FAST, prompt="x", steps=0, guidance=-1)           # the node's markers: the model's value
