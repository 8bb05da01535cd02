"""A VACE / speech-to-video input that cannot work is refused before anything is encoded, sent or
started, through the CLI's `generate` options and through the nodes (Load Wan Pipeline Model, Generate
VACE, Generate Speech-to-Video), naming the option or input to change."""
from __future__ import annotations

import numpy as np
import pytest

from pipeline_media import portrait_png, refused, smooth_frames
from vllm_omni_launcher.cli import main
from vllm_omni_launcher.client import media
from vllm_omni_launcher.models import FAMILIES, PIPELINE_FAMILIES
from vllm_omni_launcher.planner.launch_plan import GPU_MEMORY_ENV

VACE, VACE_SMALL = PIPELINE_FAMILIES["vace_14b"], PIPELINE_FAMILIES["vace_1_3b"]
S2V = PIPELINE_FAMILIES["s2v_14b"]


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


def _clirefused(capsys, argv: list[str]) -> str:
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


def test_generate_refuses_audio_for_a_model_without_speech(capsys, _no_server, tmp_path):
    err = _clirefused(capsys, ["generate", "--prompt", "x", "--model", FAMILIES["t2v_a14b"].hf_id, "--audio", "a.wav"])
    assert err.startswith("error: Wan2.2 T2V-A14B does not take --audio.")


def test_generate_s2v_without_audio_names_the_option(capsys, _no_server, tmp_path):
    (tmp_path / "face.png").write_bytes(portrait_png())
    err = _clirefused(capsys, ["generate", "--prompt", "x", "--model", S2V.hf_id, "--image", "face.png"])
    assert err == ("error: Wan2.2 S2V-14B needs audio. Why: speech-to-video follows the audio (upstream fails the job "
                   "with 'No audio provided'). Fix: pass --audio SPEECH.wav.\n")


def test_generate_vace_refuses_a_control_video_of_another_length(capsys, _no_server, tmp_path):
    (tmp_path / "pose.mp4").write_bytes(media.control_video_from_frames(smooth_frames(9, 480, 832)).mp4)
    err = _clirefused(capsys, ["generate", "--prompt", "x", "--model", VACE_SMALL.hf_id, "--control-video", "pose.mp4",
                            "--frames", "17"])
    assert "error: The control video has 9 frames, the request 17." in err


def _refused_before_reading(capsys, *argv: str) -> str:
    err = _clirefused(capsys, ["generate", "--prompt", "x", "--model", VACE_SMALL.hf_id, *argv])
    assert "no such file" not in err                    # models.check_inputs ran before the files are opened
    return err


def test_generate_refuses_a_control_video_with_references_before_reading_either(capsys, _no_server):
    assert _refused_before_reading(capsys, "--control-video", "missing.mp4", "--reference-image", "missing.png") == (
        "error: The request has both --control-video and --reference-image. Why: vLLM-Omni takes one image or one "
        "video per request for Wan (it answers 400 'does not support mixed image and video references'). Fix: leave "
        "--reference-image out or leave --control-video out.\n")


def test_generate_refuses_too_many_references_before_reading_any(capsys, _no_server):
    err = _refused_before_reading(capsys, *(arg for i in range(5) for arg in ("--reference-image", f"r{i}.png")))
    assert err.startswith("error: 5 reference images were given.") and "as --reference-image" in err


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
    err = refused(lambda: _run("VLLMOmniLoadPipelineModel", model=FAMILIES["ti2v_5b"].hf_id))
    assert "not one of Load Wan Pipeline Model's choices" in err.what and nothing_sent == []


def test_generate_vace_refuses_a_control_batch_of_another_length_before_encoding_or_sending(nothing_sent):
    batch = np.broadcast_to(np.zeros((1, 1, 1, 3), np.float32), (50, 480, 832, 3))    # no memory behind it
    err = refused(lambda: _run("VLLMOmniGenerateVACE", **_node_values(
        "VLLMOmniGenerateVACE", server=_server(VACE), prompt="a dancer", control_video=batch, frames=81)))
    assert err.what == "The control video has 50 frames, the request 81" and nothing_sent == []


def test_generate_vace_takes_a_control_batch_size_and_length_for_zero_widgets(nothing_sent, monkeypatch):
    from vllm_omni_launcher.nodes import session

    seen = {}
    monkeypatch.setattr(session, "generate_video", lambda server, **kw: seen.update(kw) or ("f", 16.0, "v"))
    _run("VLLMOmniGenerateVACE", **_node_values("VLLMOmniGenerateVACE", server=_server(VACE), prompt="x",
                                                control_video=smooth_frames(9, 352, 640)))
    assert (seen["width"], seen["height"], seen["frames"]) == (640, 352, 9)
    assert seen["control_video"].frames == 9 and nothing_sent == []


def test_generate_s2v_refuses_audio_too_long_and_a_server_of_another_model(nothing_sent):
    long = {"waveform": np.broadcast_to(np.zeros((1, 1, 1), np.float32), (1, 2, 48000 * 60)), "sample_rate": 48000}
    image = smooth_frames(1, 448, 832)
    values = _node_values("VLLMOmniGenerateSpeechToVideo", prompt="x", image=image, audio=long)
    assert refused(lambda: _run("VLLMOmniGenerateSpeechToVideo", server=_server(S2V), **values)).what == \
        "The audio is 60.0 s long"
    err = refused(lambda: _run("VLLMOmniGenerateSpeechToVideo", server=_server(VACE), **values))
    assert err.setting == "server" and "needs a Wan2.2 S2V-14B server" in err.what
    assert nothing_sent == []


def test_generate_vace_refuses_a_control_video_with_references_before_encoding_either(nothing_sent):
    batch = np.broadcast_to(np.zeros((1, 1, 1, 3), np.float32), (81, 480, 832, 3))
    err = refused(lambda: _run("VLLMOmniGenerateVACE", **_node_values(
        "VLLMOmniGenerateVACE", server=_server(VACE), prompt="x", control_video=batch, reference_images=batch[:1])))
    assert "has both control_video and reference_images" in err.what and nothing_sent == []
