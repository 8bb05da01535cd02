"""`generate --model` of a VACE or speech-to-video model checks its request, media included, before the launch is
planned or anything starts, and builds the request it sends once the serving plan is known: the check converts no
picture, so each picture (the S2V portrait, each VACE reference) is encoded once per run, at the size of the request
that is sent (the serving plan's where the options leave the size to the model). A bad picture file still fails
before anything starts, in the same words."""
from __future__ import annotations

import wave
from typing import Any, Optional

import numpy as np
import pytest
from PIL import Image

from vllm_omni_launcher.cli import generate_cmd, main
from vllm_omni_launcher.client import images, media
from vllm_omni_launcher.errors import LauncherError
from vllm_omni_launcher.models import PIPELINE_FAMILIES
from vllm_omni_launcher.planner.launch_plan import GPU_MEMORY_ENV
from vllm_omni_launcher.server import registry
from vllm_omni_launcher.server.launch import versions

VACE, S2V = PIPELINE_FAMILIES["vace_14b"], PIPELINE_FAMILIES["s2v_14b"]


class _GpuServer:
    """The registry's Supervisor here: stands in for the GPU server only, refusing to start (the run ends there)."""

    def __init__(self, spec: Any) -> None:
        self.spec = spec

    def start(self, on_status: Any = None) -> None:
        raise LauncherError("No GPU server in this test", "the request was built", "nothing")

    def stop(self, timeout: Optional[float] = None) -> None:
        return None


@pytest.fixture()
def local_run(monkeypatch, tmp_path) -> dict[str, list]:
    """A local `generate` up to the server's start, recording every picture encoded (with the size asked for),
    every request built (models.request_for as generate_cmd calls it) and every server started."""
    monkeypatch.setenv("VLLM_OMNI_LAUNCHER_CONFIG", str(tmp_path / "none.json"))
    monkeypatch.setenv("VLLM_OMNI_LAUNCHER_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(versions, "checked_server_version", lambda config: (0, 30))
    seen: dict[str, list] = {"encoded": [], "requests": [], "servers": []}
    monkeypatch.setattr(registry, "Supervisor", lambda spec, *a, **k: seen["servers"].append(spec) or _GpuServer(spec))
    png, ref, request_for = images.image_to_png, media.reference_image, generate_cmd.request_for
    monkeypatch.setattr(images, "image_to_png", lambda image, size=None, **k: seen["encoded"].append(("image", size))
                        or png(image, size, **k))
    monkeypatch.setattr(media, "reference_image", lambda image, width, height: seen["encoded"].append(
        ("reference", (width, height))) or ref(image, width, height))
    monkeypatch.setattr(generate_cmd, "request_for", lambda *a, **k: seen["requests"].append(request_for(*a, **k))
                        or seen["requests"][-1])
    Image.fromarray(np.full((300, 200, 3), 90, np.uint8)).save(tmp_path / "face.png")
    with wave.open(str(tmp_path / "speech.wav"), "wb") as speech:
        speech.setnchannels(1)
        speech.setsampwidth(2)
        speech.setframerate(16000)
        speech.writeframes(b"\0\0" * 32000)
    return seen


def _generate(capsys, model: str, *argv: str) -> str:
    assert main(["generate", "--prompt", "a singer", "--model", model, *argv]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


# 80 GB: the model's 832x448; 48 GB: the serving plan fits a smaller size, which the sent request takes
@pytest.mark.parametrize("gpu_gib", ["80", "48"])
def test_local_s2v_encodes_its_portrait_once_at_the_size_of_the_request_sent(capsys, monkeypatch, local_run, gpu_gib):
    monkeypatch.setenv(GPU_MEMORY_ENV, gpu_gib)
    err = _generate(capsys, S2V.hf_id, "--image", "face.png", "--audio", "speech.wav")
    assert "error: No GPU server in this test." in err and len(local_run["servers"]) == 1
    check, sent = local_run["requests"]                       # the check before the launch, the request sent
    assert check.image_png is None and sent.image_png is not None
    assert local_run["encoded"] == [("image", (sent.width, sent.height))]
    assert ((sent.width, sent.height) == (S2V.width, S2V.height)) == (gpu_gib == "80")


def test_local_vace_encodes_each_reference_once(capsys, monkeypatch, local_run):
    monkeypatch.setenv(GPU_MEMORY_ENV, "80")
    _generate(capsys, VACE.hf_id, "--reference-image", "face.png", "--reference-image", "face.png")
    check, sent = local_run["requests"]
    assert check.reference_images == () and len(sent.reference_images) == 2
    assert local_run["encoded"] == [("reference", (sent.width, sent.height))] * 2


def test_a_reference_file_that_is_no_picture_fails_before_anything_is_planned_or_started(capsys, monkeypatch,
                                                                                         local_run, tmp_path):
    monkeypatch.setenv(GPU_MEMORY_ENV, "80")
    (tmp_path / "notes.png").write_text("not a picture")
    err = _generate(capsys, VACE.hf_id, "--reference-image", "face.png", "--reference-image", "notes.png")
    assert err.startswith("error: --reference-image notes.png cannot be read as an image. Why: ")
    assert err.endswith("Fix: give --reference-image a PNG or JPEG file.\n")
    assert local_run["servers"] == local_run["requests"] == local_run["encoded"] == []
