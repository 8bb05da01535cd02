"""`generate` with only the MP4 asked for (no --frames-npy): the server's bytes are written as they
came, no frame is decoded, and the file is still checked against the request from its header
(frames.probe_mp4). Servers: our own on 127.0.0.1 (tests/helpers/hostile_server.py)."""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest

import hostile_server as hs
from clips import solid_clip
from hostile_jobs import job_routes
from vllm_omni_launcher.cli import generate_cmd
from vllm_omni_launcher.client import frames, video_jobs
from vllm_omni_launcher.client.api import VideoClient, VideoRequest
from vllm_omni_launcher.client.frames import probe_mp4
from vllm_omni_launcher.errors import LauncherError

W, H, F = 64, 64, 9


@pytest.fixture(scope="module")
def clip() -> tuple[bytes, float]:
    """A real small clip and the frame rate its full decode reports."""
    data = solid_clip(W, H, F)
    return data, frames.decode_mp4(data).fps


@pytest.fixture
def served(hostile) -> Callable[[bytes], VideoClient]:
    """A client of a hostile server whose one job serves `content`."""
    return lambda content: VideoClient(hostile(job_routes(hs.answer(200, content))).url)


@pytest.fixture
def no_frame_decoded(monkeypatch) -> None:
    """Any frame decode fails the test (the streamed decoder and the frame converter)."""
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a frame was decoded although only the MP4 was asked for")
    monkeypatch.setattr(video_jobs, "download_decoding", refuse)
    monkeypatch.setattr(frames, "_convert", refuse)


def cli_args(tmp_path: Path, **extra: Any) -> argparse.Namespace:
    return argparse.Namespace(out=str(tmp_path / "clip.mp4"), frames_npy=None,
                              report_json=str(tmp_path / "r.json"), **extra)


def test_only_the_mp4_asked_for_writes_the_servers_bytes_without_decoding(tmp_path, clip, served, no_frame_decoded,
                                                                          capsys):
    clip, fps = clip
    client = served(clip)
    assert generate_cmd._generate(cli_args(tmp_path), client, VideoRequest("x", width=W, height=H, num_frames=F),
                                  None) == 0
    assert (tmp_path / "clip.mp4").read_bytes() == clip
    report = json.loads((tmp_path / "r.json").read_text())
    assert (report["frames"], report["width"], report["height"], report["fps"]) == (F, W, H, fps)
    assert report["decoded"] is False and report["mp4_bytes"] == len(clip)
    assert f"{F} frames {W}x{H} at {fps:g} fps" in capsys.readouterr().out


def test_only_the_mp4_asked_for_still_refuses_bytes_that_are_not_a_video(tmp_path, served, no_frame_decoded):
    client = served(b"\x00\x00\x00\x18ftypisom" + bytes(5000))
    with pytest.raises(LauncherError) as info:
        generate_cmd._generate(cli_args(tmp_path), client, VideoRequest("x", width=W, height=H, num_frames=F), None)
    assert "not a readable video" in info.value.what
    assert not (tmp_path / "clip.mp4").exists()


def test_only_the_mp4_asked_for_still_refuses_a_clip_the_request_cannot_give(tmp_path, served, no_frame_decoded):
    client = served(solid_clip(128, 128, F))
    with pytest.raises(LauncherError) as info:
        generate_cmd._generate(cli_args(tmp_path), client, VideoRequest("x", width=W, height=H, num_frames=F), None)
    assert "got 128x128x9, asked for 64x64x9" in info.value.what
    assert not (tmp_path / "clip.mp4").exists()


def test_frames_npy_still_decodes_every_frame(tmp_path, served):
    clip = solid_clip(W, H, F)
    client = served(clip)
    args = cli_args(tmp_path)
    args.frames_npy = str(tmp_path / "f.npy")
    generate_cmd._generate(args, client, VideoRequest("x", width=W, height=H, num_frames=F), None)
    saved = np.load(tmp_path / "f.npy")
    assert saved.shape == (F, H, W, 3) and saved.dtype == np.float32
    assert np.array_equal(saved, frames.decode_mp4(clip).frames)
    assert json.loads((tmp_path / "r.json").read_text())["decoded"] is True


def test_probe_reads_from_the_header_what_the_decode_finds():
    clip = solid_clip(W, H, F)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(frames, "_convert", lambda *a: pytest.fail("probe_mp4 decoded a frame"))
        info = probe_mp4(clip)
    assert info == frames.decode_mp4(clip).info and (info.width, info.height, info.num_frames) == (W, H, F)
