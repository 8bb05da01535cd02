"""A server the launcher started here (the stub: the real vLLM-Omni 0.30 API layer and storage, fake GPU) stores each
finished MP4 in the folder launch_prep gave it; a client given Supervisor.storage_dir reads the job's file there and
never asks for /content (the server's own access log shows no such request), decodes the same frames a download
gives, and still deletes the job. A client without the folder (a remote server's) downloads as before.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest

import frame_code
from supervised_stub import make_config, spec_for

from vllm_omni_launcher.client.api import VideoClient, VideoRequest
from vllm_omni_launcher.server.supervision.supervisor import Supervisor

LOG_WAIT_S = 60.0        # bound for the server's access line of a request it has answered
W, H, FRAMES, SEED = 256, 128, 17, 5


@pytest.fixture(scope="module")
def sup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Supervisor]:
    supervisor = Supervisor(spec_for(), make_config(tmp_path_factory.mktemp("data")))
    supervisor.start()
    try:
        yield supervisor
    finally:
        supervisor.stop()


def access_lines(sup: Supervisor, method: str, path: str) -> int:
    """How many times the server's access log shows `method path` answered."""
    return Path(sup.log_path).read_text(errors="replace").count(f'"{method} {path} HTTP/1.1"')


def wait_deleted(sup: Supervisor, job_id: str) -> None:
    """Until the server logged the job's DELETE (every request of the job came before it)."""
    give_up = time.monotonic() + LOG_WAIT_S
    while not access_lines(sup, "DELETE", f"/v1/videos/{job_id}"):
        assert time.monotonic() < give_up, f"no DELETE of {job_id} in the server's log within {LOG_WAIT_S:g} s"
        time.sleep(0.05)


def test_the_finished_mp4_is_read_from_the_servers_folder_not_downloaded(sup: Supervisor) -> None:
    folder = Path(sup.storage_dir)
    assert folder.parent.name == "storage" and folder.is_dir()
    req = VideoRequest("a fox", width=W, height=H, num_frames=FRAMES, fps=16, steps=2, seed=SEED)
    with VideoClient(sup.url, api_key=sup.api_key, storage_dir=sup.storage_dir) as client:
        read = client.generate(req)
        mp4_only = client.generate(req, decode=False)           # the CLI's way: the MP4 copied, its header checked
    with VideoClient(sup.url, api_key=sup.api_key) as client:   # no folder: downloaded, as from a remote server
        downloaded = client.generate(req)
    for result in (read, mp4_only, downloaded):
        wait_deleted(sup, result.job_id)
        assert not (folder / result.job_id).exists()            # upstream's DELETE removed the stored file
    assert "disk_read" in read.timings and "disk_read" in mp4_only.timings and "disk_read" not in downloaded.timings
    assert access_lines(sup, "GET", f"/v1/videos/{read.job_id}/content") == 0
    assert access_lines(sup, "GET", f"/v1/videos/{mp4_only.job_id}/content") == 0
    assert access_lines(sup, "GET", f"/v1/videos/{downloaded.job_id}/content") >= 1
    assert read.mp4 == mp4_only.mp4 == downloaded.mp4
    assert np.array_equal(read.video.frames, downloaded.video.frames)
    assert [frame_code.decode(f) for f in read.video.frames] == [(i, SEED) for i in range(FRAMES)]
    assert mp4_only.video is None and mp4_only.info.num_frames == FRAMES
