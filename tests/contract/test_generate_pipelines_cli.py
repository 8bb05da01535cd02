"""`generate` for a VACE control video and for speech-to-video, end to end on the stub server: the launcher
starts the real 0.30 server (its HTTP layer, and the pipelines' own pre-processing hooks in the engine: a
VACE source video, S2V's image and audio) with only the GPU stubbed, sends the media and gets the frames back.
What the server makes of each form field is asserted in test_pipeline_forms.py.
"""
from __future__ import annotations

import os
import subprocess
import sys
import wave

import numpy as np

import frame_code
from stubserver import STUB_SCRIPT, server_python
from vllm_omni_launcher.client import media
from vllm_omni_launcher.client.images import image_to_png


def _generate(tmp_path, *args: str) -> tuple[subprocess.CompletedProcess, np.ndarray]:
    env = {**os.environ,
           "VLLM_OMNI_LAUNCHER_CONFIG": str(tmp_path / "none.json"),
           "VLLM_OMNI_LAUNCHER_SERVER_CMD": f"{server_python()} {STUB_SCRIPT}",
           "VLLM_OMNI_LAUNCHER_DATA_DIR": str(tmp_path / "data"),
           "VLLM_OMNI_LAUNCHER_GPU_MEMORY_GB": "141",
           "HF_HUB_CACHE": str(tmp_path / "hub"),
           "VLLM_OMNI_STUB_STEP_S": "0.01"}
    out = subprocess.run([sys.executable, "-m", "vllm_omni_launcher", "generate", "--steps", "2", "--seed", "5",
                          "--out", str(tmp_path / "clip.mp4"), "--frames-npy", str(tmp_path / "f.npy"), *args],
                         capture_output=True, text=True, env=env, cwd=tmp_path, timeout=900)
    assert out.returncode == 0, out.stderr
    return out, np.load(tmp_path / "f.npy")


def _gradient(frames: int, height: int, width: int) -> np.ndarray:
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    return np.stack([np.stack([(x + 4 * i) % width / width, y / height, np.full_like(x, i / frames)], -1)
                     for i in range(frames)])


def test_vace_follows_a_control_video_file_and_returns_its_frames(tmp_path):
    (tmp_path / "pose.mp4").write_bytes(media.control_video_from_frames(_gradient(17, 480, 832)).mp4)
    out, frames = _generate(tmp_path, "--model", "Wan-AI/Wan2.1-VACE-1.3B-diffusers", "--prompt", "a dancer",
                            "--control-video", "pose.mp4", "--frames", "17")
    assert frames.shape == (17, 480, 832, 3)
    assert [frame_code.decode(f) for f in frames] == [(i, 5) for i in range(17)]
    assert out.stdout.startswith(f"wrote {tmp_path / 'clip.mp4'}: 17 frames 832x480 at 16 fps")


def test_speech_to_video_animates_an_image_to_a_wav_file(tmp_path):
    (tmp_path / "face.png").write_bytes(image_to_png(_gradient(1, 448, 832)[0]))
    with wave.open(str(tmp_path / "speech.wav"), "wb") as writer:
        writer.setnchannels(1)
        writer.setsampwidth(2)
        writer.setframerate(22050)
        writer.writeframes((np.sin(np.arange(22050 * 3) / 8.0) * 20000).astype("<i2").tobytes())
    out, frames = _generate(tmp_path, "--model", "Wan-AI/Wan2.2-S2V-14B", "--prompt", "a singer",
                            "--image", "face.png", "--audio", "speech.wav")
    assert frames.shape == (80, 448, 832, 3)               # one 80-frame clip for 3 s of audio (the stub's count)
    assert "at 16 fps" in out.stdout
    assert "--model-class-name WanS2VPipeline" in out.stderr    # the serving line names what the family adds
