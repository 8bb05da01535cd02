"""Server bytes are only ever decoded as MP4 / H.264 yuv420p (client/server_mp4.py), on every path that
opens them: the streamed decode of a single job, the decode of bytes, the header probe of `generate
--out` (no decode), the clips of a batch. A hostile server of our own on 127.0.0.1 (hostile_server.py)
serves what FFmpeg's format probe would obey (an ffconcat script naming a local file, an SDP text that
opens UDP sockets), real clips of another codec, pixel format or container, and MP4s whose later frames
change size (hostile_media.py). Each is refused with the launcher's own message; where no MP4 header
is there, FFmpeg never opens the bytes at all (av.open is watched), and nothing they name is read.
"""
from __future__ import annotations

import argparse
import io
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import av
import numpy as np
import psutil
import pytest
from PIL import Image

import hostile_media as hm
import hostile_server as hs
from clips import solid_clip
from cancel_latency import CANCEL_LATENCY_S
from hostile_jobs import JOB, CancelOnceBlocked, job_routes
from vllm_omni_launcher.cli import generate_cmd
from vllm_omni_launcher.client import frames, server_mp4
from vllm_omni_launcher.client.api import VideoClient, VideoRequest
from vllm_omni_launcher.client.batch import run_batch
from vllm_omni_launcher.client.job_results import GenerationCancelled
from vllm_omni_launcher.errors import LauncherError

W = H = 64
F = 9
REQUEST = VideoRequest("x", width=W, height=H, num_frames=F)
NOT_MP4 = "The server's file is not an MP4"


class Opens:
    """Every av.open for reading (the launcher's; the real one runs). Writes (the tests' own clips) pass."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        self.decoders: list[Any] = []           # each opened file's first video decoder (its codec context)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        container = REAL_OPEN(*args, **kwargs)
        if "w" not in (args[1:2] or (kwargs.get("mode", "r"),)):
            self.calls.append(kwargs)
            self.decoders.append(container.streams.video[0].codec_context if container.streams.video else None)
        return container


REAL_OPEN = av.open


@pytest.fixture
def opens(monkeypatch) -> Opens:
    spy = Opens()
    monkeypatch.setattr(av, "open", spy)
    return spy


@pytest.fixture
def no_frame_converted(monkeypatch) -> None:
    monkeypatch.setattr(frames, "_convert", lambda *a: pytest.fail("a frame of a refused file was converted"))


@pytest.fixture
def local_png(tmp_path, monkeypatch) -> str:
    """ComfyUI's first output image, relative to the working directory, as an ffconcat script names it."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "output").mkdir()
    Image.fromarray(np.full((H, W, 3), 200, np.uint8)).save(tmp_path / "output" / "ComfyUI_00001_.png")
    return "output/ComfyUI_00001_.png"


def udp_sockets() -> list[Any]:
    return psutil.Process().net_connections(kind="udp")


# ----------------------------------------------------------------------------- no MP4 header: never opened

def test_the_ffconcat_attack_is_real_when_the_bytes_choose_the_demuxer(local_png):
    # What the old av.open (no format) did with this answer: FFmpeg read ComfyUI's output image as a frame.
    with REAL_OPEN(io.BytesIO(hm.ffconcat(local_png))) as container:
        assert container.format.name == "concat"
        frame = next(container.decode(video=0))
    assert (frame.width, frame.height) == (W, H)


def test_an_ffconcat_script_naming_a_local_file_is_refused_unopened(hostile, local_png, opens, no_frame_converted):
    server = hostile(job_routes(hs.answer(200, hm.ffconcat(local_png))))
    with pytest.raises(LauncherError) as info:
        VideoClient(server.url).generate(REQUEST)
    err = info.value
    assert err.what == NOT_MP4 and "start with 'ffconcat" in err.why and "'ftyp' box" in err.why
    assert "FFmpeg never opened it" in err.why and err.setting == "server"
    assert opens.calls == []                                      # no demuxer saw the bytes, so no file was read
    assert len(server.calls("DELETE", f"/v1/videos/{JOB}")) == 1  # the job is still cleaned up


def test_an_sdp_text_fails_at_once_without_a_udp_socket(hostile, opens, no_frame_converted):
    server = hostile(job_routes(hs.answer(200, hm.SDP)))
    before = udp_sockets()
    with pytest.raises(LauncherError) as info:
        VideoClient(server.url).generate(REQUEST)
    assert info.value.what == NOT_MP4 and "start with 'v=0" in info.value.why
    assert opens.calls == [] and udp_sockets() == before


def test_an_sdp_text_that_trickles_in_honours_cancel(hostile, opens):
    # The check waits only for the first 8 bytes; they come one every 2 s, and Cancel ends that wait.
    head = f"HTTP/1.1 200 OK\r\nContent-Type: video/mp4\r\nContent-Length: {len(hm.SDP)}\r\n\r\n".encode()
    cancel = CancelOnceBlocked(hs.drip(head, every_s=2.0, byte=b"v"))
    server = hostile(job_routes(cancel.serve))
    with pytest.raises(GenerationCancelled):
        VideoClient(server.url).generate(REQUEST, should_cancel=cancel)
    assert cancel.at is not None and time.monotonic() - cancel.at < CANCEL_LATENCY_S
    assert opens.calls == [] and len(server.calls("DELETE", f"/v1/videos/{JOB}")) == 1


def test_a_real_clip_in_another_container_is_refused_unopened(hostile, opens, no_frame_converted):
    server = hostile(job_routes(hs.answer(200, hm.clip("libx264", "yuv420p", "matroska"))))
    with pytest.raises(LauncherError) as info:
        VideoClient(server.url).generate(REQUEST)
    assert info.value.what == NOT_MP4 and opens.calls == []


# ----------------------------------------------------------------------------- an MP4, but not vLLM-Omni's codec

@pytest.mark.parametrize("codec, pix_fmt, shown", [("mpeg4", "yuv420p", "mpeg4"), ("mjpeg", "yuvj420p", "mjpeg"),
                                                   ("libx264", "yuv444p", "h264 yuv444p")])
def test_an_mp4_of_another_codec_is_refused_before_a_frame_is_decoded(hostile, opens, no_frame_converted,
                                                                     codec, pix_fmt, shown):
    server = hostile(job_routes(hs.answer(200, hm.clip(codec, pix_fmt))))
    with pytest.raises(LauncherError) as info:
        VideoClient(server.url).generate(REQUEST)
    err = info.value
    assert err.what == f"The server's video is {shown}, not H.264 yuv420p" and err.setting == "server"
    assert "no frame of this one was decoded" in err.why
    assert [call["format"] for call in opens.calls] == ["mp4"]          # the MP4 demuxer and no other
    assert opens.calls[0]["options"]["codec_whitelist"] == "h264"      # the probe may open only H.264's decoder
    assert not opens.decoders[0].is_open                               # ours was never opened either


def test_every_reader_of_server_bytes_goes_through_the_one_door(opens, no_frame_converted):
    # decode of bytes, header probe (generate --out) and the streamed decode (a file object) alike.
    payloads = [hm.ffconcat("output/ComfyUI_00001_.png"), hm.SDP, hm.clip("libx264", "yuv420p", "matroska")]
    for data in payloads:
        for read in (lambda d: frames.decode_mp4(d, bounds=REQUEST.bounds()), lambda d: frames.decode_mp4(d),
                     lambda d: frames.probe_mp4(d), lambda d: frames.decode_mp4(io.BytesIO(d))):
            with pytest.raises(LauncherError, match=NOT_MP4):
                read(data)
    assert opens.calls == []
    with pytest.raises(LauncherError, match="is mjpeg, not H.264"):
        frames.probe_mp4(hm.clip("mjpeg", "yuvj420p"))
    assert all(call["format"] == "mp4" for call in opens.calls)


def test_generate_out_without_decoding_refuses_the_attack_and_writes_nothing(hostile, local_png, tmp_path, opens,
                                                                            no_frame_converted):
    server = hostile(job_routes(hs.answer(200, hm.ffconcat(local_png))))
    args = argparse.Namespace(out=str(tmp_path / "clip.mp4"), frames_npy=None, report_json=None)
    with pytest.raises(LauncherError, match=NOT_MP4):
        generate_cmd._generate(args, VideoClient(server.url), REQUEST, None)
    assert not (tmp_path / "clip.mp4").exists() and opens.calls == []


def test_a_batch_refuses_a_clip_of_another_codec_and_deletes_every_job(hostile, opens, no_frame_converted):
    routes = job_routes(hs.answer(200, hm.clip("mpeg4", "yuv420p")))
    server = hostile(routes)
    with pytest.raises(LauncherError, match="is mpeg4, not H.264"):
        run_batch(VideoClient(server.url), [REQUEST, REQUEST])
    assert len(server.calls("DELETE", f"/v1/videos/{JOB}")) >= 1


def test_vllm_omnis_own_clips_still_decode(hostile, opens):
    server = hostile(job_routes(hs.answer(200, solid_clip(W, H, F))))
    result = VideoClient(server.url).generate(REQUEST)
    assert result.video.frames.shape == (F, H, W, 3)
    assert [call["format"] for call in opens.calls] == ["mp4"]


# ----------------------------------------------------------------------------- frames that change size mid-stream

NEW_SPS = ("The server's video changes its frame size after frame 5: a new H.264 sequence parameter set in its "
           "stream, where its header says 64x64 yuv420p")


@pytest.fixture
def no_guard(monkeypatch) -> None:
    """The packet guard off, to prove the layers behind it (max_pixels, the frame compare) on their own."""
    monkeypatch.setattr(server_mp4.SizeGuard, "check", lambda self, packet, width, height, after: None)


def test_later_frames_larger_than_the_header_are_refused_with_the_launchers_message(hostile):
    server = hostile(job_routes(hs.answer(200, hm.resized((W, H, 5), (1024, 1024, 4)))))
    with pytest.raises(LauncherError) as info:
        VideoClient(server.url).generate(REQUEST)
    err = info.value
    assert err.what == NEW_SPS
    assert "stopped decoding before allocating them" in err.why and err.setting == "server"


def test_later_frames_smaller_than_the_header_are_refused_too():
    with pytest.raises(LauncherError) as info:
        frames.decode_mp4(hm.resized((W, H, 5), (32, 32, 4)), bounds=REQUEST.bounds())
    assert info.value.what == NEW_SPS


def test_behind_the_guard_the_decoder_refuses_larger_frames_itself(no_guard):
    with pytest.raises(LauncherError) as info:
        frames.decode_mp4(hm.resized((W, H, 5), (1024, 1024, 4)), bounds=REQUEST.bounds())
    assert info.value.what == ("The server's video changes its frame size after frame 5: 1024x1024, where its "
                               "header says 64x64 yuv420p")                # max_pixels: FFmpeg allocated no such frame


def test_behind_the_guard_a_frame_of_another_size_is_refused_at_the_first_one(no_guard):
    with pytest.raises(LauncherError) as info:
        frames.decode_mp4(hm.resized((W, H, 5), (32, 32, 4)), bounds=REQUEST.bounds())
    assert "changes its frame size after frame 5: 32x32 yuv420p, where its header says 64x64" in info.value.what


def test_a_repeated_header_parameter_set_is_not_a_change():
    # The first encode repeats the header's own SPS in its first packet (x264 with in-band headers): accepted.
    video = frames.decode_mp4(hm.resized((W, H, 5), (W, H, 4)), bounds=REQUEST.bounds())
    assert video.frames.shape == (F, H, W, 3)


def test_the_decoder_is_bounded_to_the_headers_frame_size_and_16_threads():
    with REAL_OPEN(io.BytesIO(solid_clip(240, 128, 3)), format="mp4") as container:
        stream = container.streams.video[0]
        server_mp4.bound_decoder(stream, 64, "AUTO")
        assert stream.codec_context.thread_count == server_mp4.MAX_DECODER_THREADS == 16
        assert int(stream.codec_context.options["max_pixels"]) == 256 * 128    # aligned, never the later frames'


GROWN = """
import sys
from vllm_omni_launcher.client import frames, server_mp4
from vllm_omni_launcher.client.bounds import bounds_for
from vllm_omni_launcher.errors import LauncherError
if sys.argv[3] == "unbounded":      # the control: no packet guard, no max_pixels (only the frame compare)
    server_mp4.SizeGuard.check = lambda self, packet, width, height, after: None
    frames.bound_decoder = lambda stream, threads, thread_type: setattr(stream.codec_context, "thread_count", threads)
bounds = bounds_for(256, 256, 7, {})


def kib(field):
    return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith(field + ":"))


frames.decode_mp4(open(sys.argv[2], "rb").read(), bounds=bounds, threads=8)   # warm: libraries, threads
data = open(sys.argv[1], "rb").read()
with open("/proc/self/clear_refs", "w") as refs:
    refs.write("5")                 # the peak RSS (VmHWM) starts again from the current RSS
before = kib("VmRSS")
try:
    frames.decode_mp4(data, bounds=bounds, threads=8)
except LauncherError as exc:
    print(exc.what)
print((kib("VmHWM") - before) * 1024)
"""
ARRAY = 9 * 256 * 256 * 12              # the most the request allows (256x256x7: up to 9 frames), float32: 7 MiB
FRAME = 4096 * 4096 * 3 // 2            # one 4096x4096 yuv420p frame: 24 MiB


@pytest.fixture(scope="module")
def grown_files(tmp_path_factory) -> tuple[Path, Path]:
    """256x256 in the header (7 frames), 5 frames of it then 2 of 4096x4096 (the issue's case, in 15 KB);
    and an honest 256x256x7 clip."""
    folder = tmp_path_factory.mktemp("grown")
    grown, honest = folder / "grown.mp4", folder / "honest.mp4"
    grown.write_bytes(hm.resized((256, 256, 5), (4096, 4096, 2)))
    honest.write_bytes(solid_clip(256, 256, 7))
    return grown, honest


def peak_growth(files: tuple[Path, Path], mode: str) -> tuple[str, int]:
    """Decode the grown clip in a fresh process: (its error's what, how much its peak RSS grew; Linux's
    /proc/self/clear_refs restarts the peak after the warm-up decode)."""
    out = subprocess.run([sys.executable, "-c", GROWN, str(files[0]), str(files[1]), mode], capture_output=True,
                         text=True, timeout=120, check=True).stdout.splitlines()
    return out[0], int(out[1])


def test_frames_growing_past_the_header_never_get_their_memory(grown_files):
    what, grew = peak_growth(grown_files, "shipped")
    assert what.startswith("The server's video changes its frame size after frame 5: a new H.264 sequence")
    assert grew < ARRAY + (8 << 20), f"peak RSS grew {grew / (1 << 20):.0f} MiB for a 7 MiB clip"


def test_without_the_bounds_the_same_clip_allocates_large_frames(grown_files):
    # The control: the measure sees what the bounds prevent (the frame compare alone comes too late).
    what, grew = peak_growth(grown_files, "unbounded")
    assert what.startswith("The server's video changes its frame size after frame 5: 4096x4096")
    assert grew >= FRAME, f"peak RSS grew only {grew / (1 << 20):.0f} MiB"
