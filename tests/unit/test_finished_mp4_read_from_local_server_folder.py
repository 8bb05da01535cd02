"""A server this launcher started here stores each finished job's MP4 as `<storage folder>/<job id>` before it
says the job is completed (vLLM-Omni's LocalStorageManager): a client given that folder reads the file there
instead of GET /content, with the same decode and checks, and falls back to the download whenever the file is
not a plain regular file of ours within the cap (a link is never followed, a FIFO never opened for long).

The server is our own on 127.0.0.1 (hostile_server.py), serving the MP4 like upstream's FileResponse; the folder
is laid out as upstream lays it out (the real layout is checked against the 0.30 server in
tests/contract/test_supervised_mp4_read_from_storage.py). Whether the file was read shows in the server's own
request log (no /content GET) and in the result's `disk_read` timing."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import pytest

import clips
import hostile_server as hs
from clips import NOISY_F as F, NOISY_H as H, NOISY_W as W
from hostile_jobs import JOB, file_route, job_routes
from vllm_omni_launcher.client import local_result
from vllm_omni_launcher.client.api import GenerationCancelled, VideoClient
from vllm_omni_launcher.client.bounds import bounds_for
from vllm_omni_launcher.client.frames import decode_mp4
from vllm_omni_launcher.client.request import VideoRequest
from vllm_omni_launcher.errors import LauncherError

CONTENT = f"/v1/videos/{JOB}/content"
REQUEST = VideoRequest("a fox", width=W, height=H, num_frames=F, fps=16, steps=2, seed=1)


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """A storage folder as launch_prep makes it: ours, 0700."""
    path = tmp_path / "storage" / "fingerprint"
    path.mkdir(parents=True)
    path.chmod(0o700)
    return path


@pytest.fixture
def server(hostile: Callable[[dict], hs.HostileServer], noisy_mp4: bytes) -> Iterator[hs.HostileServer]:
    yield hostile(job_routes(file_route(noisy_mp4)))


def content_gets(server: hs.HostileServer) -> int:
    return len(server.calls("GET", CONTENT))


def other_clip() -> bytes:
    """A valid MP4 unlike the served one: a result equal to it came from a file that must not have been read."""
    return clips.noisy_clip(W, H, F - 4)


def test_a_finished_job_is_decoded_from_the_servers_folder_without_a_download(server, folder, noisy_mp4):
    (folder / JOB).write_bytes(noisy_mp4)
    with VideoClient(server.url, storage_dir=str(folder)) as client:
        result = client.generate(REQUEST)
    assert content_gets(server) == 0
    assert result.mp4 == noisy_mp4
    assert np.array_equal(result.video.frames, decode_mp4(noisy_mp4, bounds=REQUEST.bounds()).frames)
    assert result.timings["disk_read"] >= 0 and result.timings["job_done"] <= result.timings["downloaded"]
    assert [e.path for e in server.calls("DELETE")] == [f"/v1/videos/{JOB}"]   # the job is still deleted after


def test_frames_read_from_the_folder_equal_the_downloaded_ones(server, folder, noisy_mp4):
    (folder / JOB).write_bytes(noisy_mp4)
    with VideoClient(server.url) as client:
        downloaded = client.generate(REQUEST)
    with VideoClient(server.url, storage_dir=str(folder)) as client:
        read = client.generate(REQUEST)
    assert content_gets(server) >= 1 and "disk_read" not in downloaded.timings and "disk_read" in read.timings
    assert read.mp4 == downloaded.mp4
    assert np.array_equal(read.video.frames, downloaded.video.frames)


def test_the_mp4_only_path_copies_the_file_and_checks_its_header(server, folder, noisy_mp4):
    (folder / JOB).write_bytes(noisy_mp4)
    with VideoClient(server.url, storage_dir=str(folder)) as client:
        result = client.generate(REQUEST, decode=False)
    assert content_gets(server) == 0 and "disk_read" in result.timings
    assert result.mp4 == noisy_mp4 and result.video is None
    assert (result.info.width, result.info.height, result.info.num_frames) == (W, H, F)


def test_a_file_outside_the_request_is_refused_like_a_downloaded_one(server, folder):
    (folder / JOB).write_bytes(clips.noisy_clip(W * 2, H, F))      # wider than asked: same refusal as over HTTP
    with VideoClient(server.url, storage_dir=str(folder)) as client:
        with pytest.raises(LauncherError, match=f"does not match the request: got {W * 2}x{H}"):
            client.generate(REQUEST)
    assert content_gets(server) == 0


def test_a_missing_file_is_downloaded(server, folder, noisy_mp4):
    with VideoClient(server.url, storage_dir=str(folder)) as client:
        result = client.generate(REQUEST)
    assert content_gets(server) >= 1 and result.mp4 == noisy_mp4 and "disk_read" not in result.timings


def test_a_link_in_place_of_the_file_is_not_followed(server, folder, tmp_path, noisy_mp4):
    elsewhere = tmp_path / "elsewhere.mp4"
    elsewhere.write_bytes(other_clip())
    (folder / JOB).symlink_to(elsewhere)
    with VideoClient(server.url, storage_dir=str(folder)) as client:
        result = client.generate(REQUEST)
    assert result.mp4 == noisy_mp4 and content_gets(server) >= 1     # the download's bytes, not the link target's


def test_a_linked_folder_is_not_followed(server, tmp_path, folder, noisy_mp4):
    (folder / JOB).write_bytes(other_clip())
    linked = tmp_path / "linked"
    linked.symlink_to(folder)
    with VideoClient(server.url, storage_dir=str(linked)) as client:
        result = client.generate(REQUEST)
    assert result.mp4 == noisy_mp4 and content_gets(server) >= 1


@pytest.mark.parametrize("make", [os.mkfifo, os.mkdir], ids=["fifo", "directory"])
def test_something_else_than_a_regular_file_is_downloaded_instead(server, folder, noisy_mp4, make):
    make(folder / JOB)                 # a FIFO opened without O_NONBLOCK would hang here until a writer came
    with VideoClient(server.url, storage_dir=str(folder)) as client:
        result = client.generate(REQUEST)
    assert result.mp4 == noisy_mp4 and content_gets(server) >= 1


def test_a_folder_others_can_write_to_is_not_trusted(server, folder, noisy_mp4):
    (folder / JOB).write_bytes(other_clip())
    folder.chmod(0o777)
    with VideoClient(server.url, storage_dir=str(folder)) as client:
        result = client.generate(REQUEST)
    assert result.mp4 == noisy_mp4 and content_gets(server) >= 1


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root (chown)")
def test_a_file_of_another_user_is_not_read(server, folder, noisy_mp4):
    (folder / JOB).write_bytes(other_clip())
    os.chown(folder / JOB, 4321, 4321)
    with VideoClient(server.url, storage_dir=str(folder)) as client:
        result = client.generate(REQUEST)
    assert result.mp4 == noisy_mp4 and content_gets(server) >= 1


def test_a_file_over_the_cap_is_not_read(server, folder, noisy_mp4, monkeypatch):
    reads: list[int] = []
    real = local_result._read
    monkeypatch.setattr(local_result, "_read", lambda fd, size, cancel: reads.append(size) or real(fd, size, cancel))
    with open(folder / JOB, "wb") as f:          # sparse: one byte past the request's cap
        f.truncate(REQUEST.bounds().max_bytes + 1)
    with VideoClient(server.url, storage_dir=str(folder)) as client:
        result = client.generate(REQUEST)
    assert reads == [] and result.mp4 == noisy_mp4 and content_gets(server) >= 1


@pytest.mark.parametrize("job_id", ["../escape", "a/b", "a\0b", ".", "..", "x" * 256, ""])
def test_a_job_id_that_is_not_one_file_name_never_reaches_the_disk(job_id):
    assert not local_result.plain_name(job_id)
    assert local_result.read_stored("/", job_id, 1 << 30) is None


def test_an_id_naming_a_file_outside_the_folder_is_downloaded(hostile, tmp_path, folder, noisy_mp4):
    (tmp_path / "storage" / "escape").write_bytes(other_clip())      # where "../escape" would lead
    server = hostile(job_routes(file_route(noisy_mp4), job_id="../escape", segment="..%2Fescape"))
    with VideoClient(server.url, storage_dir=str(folder)) as client:
        result = client.generate(REQUEST)
    assert result.mp4 == noisy_mp4 and len(server.calls("GET", "/v1/videos/..%2Fescape/content")) >= 1


def test_a_cancel_stops_the_read_and_leaves_the_job(server, folder, noisy_mp4):
    (folder / JOB).write_bytes(noisy_mp4)
    with VideoClient(server.url, storage_dir=str(folder)) as client:
        with pytest.raises(GenerationCancelled) as caught:
            client.download_decoded(JOB, bounds_for(W, H, F, {}), should_cancel=lambda: True)
    assert not caught.value.deleted and content_gets(server) == 0
