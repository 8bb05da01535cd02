"""VACE, speech-to-video and step-distilled models: recognised, launched with what they need, and their
media checked and bounded before anything is sent (docs/wan-pipelines.md). The form these requests
make is read back by the real 0.30 parser in tests/contract/test_pipeline_forms.py."""
from __future__ import annotations

import base64
import io
import json
import wave

import numpy as np
import pytest

from vllm_omni_launcher.cli import main
from vllm_omni_launcher.client import media
from vllm_omni_launcher.client.frames import decode_mp4
from vllm_omni_launcher.client.images import image_to_png
from vllm_omni_launcher.errors import LauncherError, SpecError
from vllm_omni_launcher.models import FAMILIES, PIPELINE_FAMILIES, family_for, family_of_folder, request_for
from vllm_omni_launcher.planner.memory import plan
from vllm_omni_launcher.planner.launch_plan import GPU_MEMORY_ENV
from vllm_omni_launcher.server.launch.spec import LaunchSpec

VACE, VACE_SMALL = PIPELINE_FAMILIES["vace_14b"], PIPELINE_FAMILIES["vace_1_3b"]
S2V, FAST = PIPELINE_FAMILIES["s2v_14b"], PIPELINE_FAMILIES["fastwan_ti2v_5b"]


def _smooth(frames: int, height: int, width: int) -> np.ndarray:
    """A moving gradient (compresses like footage, unlike noise)."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    return np.stack([np.stack([(x + 4 * i) % width / width, y / height, np.full_like(x, i / max(1, frames))], -1)
                     for i in range(frames)])


def _portrait(width: int = 832, height: int = 448) -> bytes:
    return image_to_png(_smooth(1, height, width)[0])


def _err(call) -> LauncherError:
    with pytest.raises(LauncherError) as info:
        call()
    return info.value


# ----------------------------------------------------------------------------- recognition
def test_the_three_base_families_and_their_dropdowns_stay_as_released():
    assert list(FAMILIES) == ["t2v_a14b", "i2v_a14b", "ti2v_5b"]
    assert not set(FAMILIES) & set(PIPELINE_FAMILIES)


@pytest.mark.parametrize("hf_id,key", [("Wan-AI/Wan2.1-VACE-14B-diffusers", "vace_14b"),
                                       ("wan-ai/wan2.1-vace-1.3b-diffusers", "vace_1_3b"),
                                       ("Wan-AI/Wan2.2-S2V-14B", "s2v_14b"),
                                       ("FastVideo/FastWan2.2-TI2V-5B-FullAttn-Diffusers", "fastwan_ti2v_5b")])
def test_each_pipeline_repo_is_its_family(hf_id, key):
    assert family_for(hf_id).key == key


def _diffusers(tmp_path, cls: str, **transformer) -> object:
    (tmp_path / "transformer").mkdir()
    (tmp_path / "model_index.json").write_text(json.dumps({"_class_name": cls}))
    (tmp_path / "transformer" / "config.json").write_text(json.dumps(transformer))
    return tmp_path


def test_a_vace_folder_is_told_apart_by_its_transformer_shape(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    small = _diffusers(tmp_path / "a", "WanVACEPipeline", num_layers=30, num_attention_heads=12)
    big = _diffusers(tmp_path / "b", "WanVACEPipeline", num_layers=40, num_attention_heads=40)
    assert family_of_folder(small).key == "vace_1_3b" and family_of_folder(big).key == "vace_14b"


def test_a_fastwan_ti2v_folder_is_recognised_and_other_distilled_shapes_are_refused(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    assert family_of_folder(_diffusers(tmp_path / "a", "WanDMDPipeline", in_channels=48)).key == "fastwan_ti2v_5b"
    err = _err(lambda: family_of_folder(_diffusers(tmp_path / "b", "WanT2VDMD2Pipeline", in_channels=16)))
    assert "no shape for" in err.what and "FastWan2.2-TI2V-5B-FullAttn-Diffusers" in err.fix


def test_the_s2v_original_layout_without_model_index_is_recognised(tmp_path):
    (tmp_path / "wav2vec2-large-xlsr-53-english").mkdir()
    (tmp_path / "Wan2.1_VAE.pth").write_bytes(b"")
    (tmp_path / "config.json").write_text("{}")
    assert family_of_folder(tmp_path).key == "s2v_14b"


def test_load_model_lists_no_pipeline_folder_and_the_doctor_says_why(tmp_path):
    from vllm_omni_launcher.models import find_local_models

    (tmp_path / "vace").mkdir()
    _diffusers(tmp_path / "vace", "WanVACEPipeline", num_layers=30, num_attention_heads=12)
    skipped: dict[str, str] = {}
    assert find_local_models([tmp_path], skipped) == {}
    assert skipped == {str(tmp_path / "vace"): "a Wan2.1 VACE-1.3B model: not one of Load Model's Wan2.2 families"}
    assert find_local_models([tmp_path], pipelines=True)["local/vace"].family.key == "vace_1_3b"


def test_an_s2v_original_folder_is_found_only_among_pipeline_folders(tmp_path):
    from vllm_omni_launcher.models import find_local_models

    folder = tmp_path / "Wan-AI" / "Wan2.2-S2V-14B"
    (folder / "wav2vec2-large-xlsr-53-english").mkdir(parents=True)
    (folder / "Wan2.1_VAE.pth").write_bytes(b"")
    (folder / "config.json").write_text("{}")
    assert find_local_models([tmp_path]) == {}
    assert find_local_models([tmp_path], pipelines=True)["local/Wan-AI/Wan2.2-S2V-14B"].family.key == "s2v_14b"


# ----------------------------------------------------------------------------- launch
def test_s2v_is_launched_with_its_pipeline_class_once():
    assert LaunchSpec(model=S2V.hf_id).flags()[-2:] == ["--model-class-name", "WanS2VPipeline"]
    given = LaunchSpec(model=S2V.hf_id, extra_flags=("--model-class-name", "WanS2VPipeline"))
    assert given.flags().count("--model-class-name") == 1


def test_fastwan_is_refused_on_a_server_line_without_its_pipeline():
    assert LaunchSpec(model=FAST.hf_id).validate(version=(0, 30)) == []
    with pytest.raises(SpecError) as info:
        LaunchSpec(model=FAST.hf_id).validate(version=(0, 26))
    assert "needs vLLM-Omni 0.30" in info.value.what and info.value.setting == "model"


@pytest.mark.parametrize("family", list(PIPELINE_FAMILIES.values()), ids=lambda f: f.key)
def test_the_plan_of_a_new_family_says_it_is_uncalibrated(family):
    text = plan(LaunchSpec(model=family.hf_id), gpus=[141.0]).text()
    assert "UNCALIBRATED" in text and family.label in text


def test_the_plan_of_a_measured_family_is_not_marked_uncalibrated():
    assert "UNCALIBRATED" not in plan(LaunchSpec(model=FAMILIES["ti2v_5b"].hf_id), gpus=[141.0]).text()


# ----------------------------------------------------------------------------- VACE
def test_a_control_video_goes_as_an_mp4_upload_that_decodes_to_its_frames():
    clip = media.control_video_from_frames(_smooth(17, 480, 832))
    request = request_for(VACE, prompt="a dancer", frames=17, control_video=clip)
    name, data, mime = request.form_fields()["input_reference"]
    assert (name, mime) == ("control.mp4", "video/mp4")
    decoded = decode_mp4(data)
    assert decoded.frames.shape == (17, 480, 832, 3)
    assert np.abs(decoded.frames - _smooth(17, 480, 832)).mean() < 0.02      # near-lossless


def test_a_control_video_of_another_frame_count_is_refused_before_sending():
    clip = media.control_video_from_frames(_smooth(21, 480, 832))
    err = _err(lambda: request_for(VACE, prompt="a dancer", frames=17, control_video=clip))
    assert err.what == "The control video has 21 frames, the request 17" and err.setting == "control_video"


def test_a_control_video_of_another_size_is_refused_before_sending():
    clip = media.control_video_from_frames(_smooth(17, 480, 640))
    err = _err(lambda: request_for(VACE, prompt="a dancer", frames=17, control_video=clip))
    assert err.what == "The control video is 640x480, the request 832x480" and "832x480" in err.fix


def test_an_oversized_control_batch_is_refused_from_its_shape_without_encoding():
    huge = np.broadcast_to(np.zeros((1, 1, 1, 3), np.uint8), (1000, 2160, 3840, 3))   # no memory behind it
    err = _err(lambda: media.control_video_from_frames(huge))
    assert "3840x2160 with 1000 frames" in err.what and err.setting == "control_video"


def test_a_control_mp4_file_is_checked_from_its_header(tmp_path):
    path = tmp_path / "pose.mp4"
    path.write_bytes(media.control_video_from_frames(_smooth(9, 480, 832)).mp4)
    clip = media.control_video_from_mp4(str(path))
    assert (clip.frames, clip.width, clip.height) == (9, 832, 480)
    (tmp_path / "notes.mp4").write_text("not a video")
    err = _err(lambda: media.control_video_from_mp4(str(tmp_path / "notes.mp4")))
    assert err.what.endswith("is not an H.264 MP4 the launcher can send") and "libx264" in err.fix


def test_several_references_go_as_one_image_reference_list_at_the_request_size():
    refs = media.reference_images_from_batch(_smooth(3, 300, 200), 832, 480)
    form = request_for(VACE_SMALL, prompt="a cat", reference_images=refs).form_fields((0, 30))
    items = json.loads(form["image_reference"])
    assert len(items) == 3 and "input_reference" not in form
    from PIL import Image
    with Image.open(io.BytesIO(base64.b64decode(items[0]["image_url"].split(",", 1)[1]))) as img:
        assert img.size == (832, 480)


def test_one_reference_is_an_upload_and_several_need_0_30():
    one = media.reference_images_from_batch(_smooth(1, 480, 832), 832, 480)
    assert request_for(VACE, prompt="a cat", reference_images=one).form_fields((0, 26))["input_reference"][2] == \
        "image/jpeg"
    two = media.reference_images_from_batch(_smooth(2, 480, 832), 832, 480)
    err = _err(lambda: request_for(VACE, prompt="a cat", reference_images=two).form_fields((0, 26)))
    assert err.what == "2 reference images need vLLM-Omni 0.30"


def test_more_than_four_references_are_refused_before_any_is_encoded():
    many = np.broadcast_to(np.zeros((1, 1, 1, 3), np.float32), (5, 4000, 4000, 3))
    assert _err(lambda: media.reference_images_from_batch(many, 832, 480)).what == "5 reference images were given"


def test_references_and_a_control_video_together_are_refused_as_upstream_would():
    clip = media.control_video_from_frames(_smooth(17, 480, 832))
    refs = media.reference_images_from_batch(_smooth(1, 480, 832), 832, 480)
    request = request_for(VACE, prompt="x", frames=17, control_video=clip)
    request.reference_images = refs
    err = _err(request.form_fields)
    assert err.what == "The request has both control_video and reference_images"


def test_vace_sends_no_flow_shift_it_would_ignore():
    form = request_for(VACE, prompt="x").form_fields()
    assert "flow_shift" not in form and form["num_inference_steps"] == "50"


def test_media_a_family_cannot_take_is_refused_with_the_input_name():
    clip = media.control_video_from_frames(_smooth(81, 480, 832))
    err = _err(lambda: request_for(FAMILIES["t2v_a14b"], prompt="x", control_video=clip))
    assert err.setting == "control_video" and "does not take control video" in err.what


# ----------------------------------------------------------------------------- S2V
def _speech(seconds: float, rate: int = 44100) -> media.AudioClip:
    t = np.arange(int(seconds * rate)) / rate
    return media.audio_clip(np.stack([np.sin(2 * np.pi * 220 * t)] * 2)[None].astype(np.float32), rate)


def test_s2v_audio_goes_as_a_16khz_mono_wav_data_url_under_one_mebibyte():
    form = request_for(S2V, prompt="a singer", image_png=_portrait(), audio=_speech(7.0)).form_fields()
    url = json.loads(form["audio_reference"])["audio_url"]
    assert url.startswith("data:audio/wav;base64,") and len(form["audio_reference"]) <= media.FORM_TEXT_PART_MAX
    with wave.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1]))) as reader:
        assert (reader.getnchannels(), reader.getframerate(), reader.getnframes()) == (1, 16000, 112000)
    assert form["num_frames"] == "80" and form["fps"] == "16" and "flow_shift" not in form


def test_the_longest_allowed_audio_still_fits_the_form_part():
    assert len(_speech(media.MAX_AUDIO_S, 16000).form_value()) <= media.FORM_TEXT_PART_MAX


def test_audio_too_long_is_refused_from_its_shape_before_conversion():
    long = np.broadcast_to(np.zeros((1, 1), np.float32), (2, 48000 * 600))
    err = _err(lambda: media.audio_clip(long, 48000))
    assert err.what == "The audio is 600.0 s long" and err.setting == "audio"


def test_s2v_without_audio_or_image_is_refused():
    assert _err(lambda: request_for(S2V, prompt="x", image_png=_portrait())).setting == "audio"
    assert _err(lambda: request_for(S2V, prompt="x", audio=_speech(2.0))).setting == "image"


def test_s2v_frames_are_per_clip_and_the_clip_length_follows_the_audio():
    request = request_for(S2V, prompt="x", image_png=_portrait(), audio=_speech(7.0))   # 112 frames of audio
    bounds = request.bounds()
    assert bounds.min_frames <= 2 * 80 - 3 <= bounds.max_frames                      # two 80-frame clips
    bounds.check(832, 448, 157)
    with pytest.raises(LauncherError):
        bounds.check(832, 448, 400)
    assert _err(lambda: request_for(S2V, prompt="x", frames=81, image_png=_portrait(), audio=_speech(2.0))).fix \
        == "set frames to 80"


def test_s2v_refuses_another_fps_that_would_desync_the_audio():
    err = _err(lambda: request_for(S2V, prompt="x", fps=24, image_png=_portrait(), audio=_speech(2.0)))
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
    assert _err(lambda: media.audio_clip_from_wav(str(tmp_path / "long.wav"))).what == "The audio is 25.0 s long"


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
    err = _err(lambda: request_for(FAST, prompt="x", steps=8))
    assert err.what == "FastWan2.2 TI2V-5B (3 steps) runs 3 as steps, not 8" and err.setting == "steps"
    request_for(FAST, prompt="x", steps=0, guidance=-1)           # the node's markers: the model's value


# ----------------------------------------------------------------------------- CLI
@pytest.fixture()
def _no_server(monkeypatch, tmp_path):
    monkeypatch.setenv(GPU_MEMORY_ENV, "141")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("VLLM_OMNI_LAUNCHER_CONFIG", str(tmp_path / "none.json"))
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    for name in ("SERVER_CMD", "SERVER_ENV"):
        monkeypatch.delenv(f"VLLM_OMNI_LAUNCHER_{name}", raising=False)
    monkeypatch.chdir(tmp_path)


def _cli_err(capsys, argv: list[str]) -> str:
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


def test_generate_refuses_audio_for_a_model_without_speech(capsys, _no_server, tmp_path):
    err = _cli_err(capsys, ["generate", "--prompt", "x", "--model", FAMILIES["t2v_a14b"].hf_id, "--audio", "a.wav"])
    assert err.startswith("error: Wan2.2 T2V-A14B does not take --audio.")


def test_generate_s2v_without_audio_names_the_option(capsys, _no_server, tmp_path):
    (tmp_path / "face.png").write_bytes(_portrait())
    err = _cli_err(capsys, ["generate", "--prompt", "x", "--model", S2V.hf_id, "--image", "face.png"])
    assert err.startswith("error: Wan2.2 S2V-14B needs --image and --audio.")


def test_generate_vace_refuses_a_control_video_of_another_length(capsys, _no_server, tmp_path):
    (tmp_path / "pose.mp4").write_bytes(media.control_video_from_frames(_smooth(9, 480, 832)).mp4)
    err = _cli_err(capsys, ["generate", "--prompt", "x", "--model", VACE_SMALL.hf_id, "--control-video", "pose.mp4",
                            "--frames", "17"])
    assert "error: The control video has 9 frames, the request 17." in err


# ----------------------------------------------------------------------------- nodes
@pytest.fixture()
def nothing_sent(monkeypatch):
    """Records any HTTP request or server start (a refused input must cause none)."""
    from vllm_omni_launcher.client import transport
    from vllm_omni_launcher.server import registry

    sent: list = []
    monkeypatch.setattr(transport.Transport, "request", lambda self, *a, **k: sent.append(("http", a)))
    monkeypatch.setattr(registry, "get_or_start", lambda *a, **k: sent.append(("start", a)))
    return sent


def _server(family) -> object:
    from vllm_omni_launcher.nodes.handles import ServerHandle

    return ServerHandle("remote", "http://127.0.0.1:9", family.hf_id, family.key)


def _run(node_id: str, **values):
    from comfy_standin import run_node

    return run_node(node_id, **values)


def _node_values(node_id: str, **values) -> dict:
    from vllm_omni_launcher.nodes import NODES

    return {**{i.name: i.default for i in NODES[node_id].inputs() if i.default is not None}, **values}


def test_load_wan_pipeline_model_offers_the_pipeline_presets_only(nothing_sent):
    (choice,) = _run("VLLMOmniLoadPipelineModel", model=S2V.hf_id)
    assert (choice.model, choice.family.key) == (S2V.hf_id, "s2v_14b")
    err = _err(lambda: _run("VLLMOmniLoadPipelineModel", model=FAMILIES["ti2v_5b"].hf_id))
    assert "not one of Load Wan Pipeline Model's choices" in err.what and nothing_sent == []


def test_generate_vace_refuses_a_control_batch_of_another_length_before_encoding_or_sending(nothing_sent):
    batch = np.broadcast_to(np.zeros((1, 1, 1, 3), np.float32), (50, 480, 832, 3))    # no memory behind it
    err = _err(lambda: _run("VLLMOmniGenerateVACE", **_node_values(
        "VLLMOmniGenerateVACE", server=_server(VACE), prompt="a dancer", control_video=batch, frames=81)))
    assert err.what == "The control video has 50 frames, the request 81" and nothing_sent == []


def test_generate_vace_takes_a_control_batch_size_and_length_for_zero_widgets(nothing_sent, monkeypatch):
    from vllm_omni_launcher.nodes import session

    seen = {}
    monkeypatch.setattr(session, "generate_video", lambda server, **kw: seen.update(kw) or ("f", 16.0, "v"))
    _run("VLLMOmniGenerateVACE", **_node_values("VLLMOmniGenerateVACE", server=_server(VACE), prompt="x",
                                                control_video=_smooth(9, 352, 640)))
    assert (seen["width"], seen["height"], seen["frames"]) == (640, 352, 9)
    assert seen["control_video"].frames == 9 and nothing_sent == []


def test_generate_s2v_refuses_audio_too_long_and_a_server_of_another_model(nothing_sent):
    long = {"waveform": np.broadcast_to(np.zeros((1, 1, 1), np.float32), (1, 2, 48000 * 60)), "sample_rate": 48000}
    image = _smooth(1, 448, 832)
    values = _node_values("VLLMOmniGenerateSpeechToVideo", prompt="x", image=image, audio=long)
    assert _err(lambda: _run("VLLMOmniGenerateSpeechToVideo", server=_server(S2V), **values)).what == \
        "The audio is 60.0 s long"
    err = _err(lambda: _run("VLLMOmniGenerateSpeechToVideo", server=_server(VACE), **values))
    assert err.setting == "server" and "needs a Wan2.2 S2V-14B server" in err.what
    assert nothing_sent == []


def test_generate_vace_refuses_a_control_video_with_references_before_encoding_either(nothing_sent):
    batch = np.broadcast_to(np.zeros((1, 1, 1, 3), np.float32), (81, 480, 832, 3))
    err = _err(lambda: _run("VLLMOmniGenerateVACE", **_node_values(
        "VLLMOmniGenerateVACE", server=_server(VACE), prompt="x", control_video=batch, reference_images=batch[:1])))
    assert "has both control_video and reference_images" in err.what and nothing_sent == []
