"""A batch's clips take the single job's download path (VideoClient.download_decoded): decoded
while they download, with the index fetched by a `Range` tail, each into its rows of the batch.

The server is our own on 127.0.0.1, serving real MP4s (index after the data, as vLLM-Omni writes
them) the way upstream's FileResponse does (`Accept-Ranges: bytes`, 206 for a suffix range)."""
from __future__ import annotations

import itertools
from typing import Iterator

import numpy as np
import pytest

import hostile_server as hs
from clips import NOISY_F as F, NOISY_H as H, NOISY_W as W
from hostile_jobs import file_route, job_body
from vllm_omni_launcher.client import streamed_download
from vllm_omni_launcher.client.api import VideoClient
from vllm_omni_launcher.client.batch import run_batch
from vllm_omni_launcher.client.bounds import bounds_for
from vllm_omni_launcher.client.frames import decode_mp4
from vllm_omni_launcher.client.request import VideoRequest

JOBS = ("b0", "b1", "b2")


@pytest.fixture
def server(noisy_mp4: bytes) -> Iterator[hs.HostileServer]:
    ids = itertools.count()

    def submit(peer: hs.Peer) -> None:
        hs.answer(200, job_body(JOBS[next(ids)], "queued"))(peer)

    routes: dict = {("POST", "/v1/videos"): submit}
    for job in JOBS:
        routes[("GET", f"/v1/videos/{job}")] = hs.answer(200, job_body(job))
        routes[("GET", f"/v1/videos/{job}/content")] = file_route(noisy_mp4)
        routes[("DELETE", f"/v1/videos/{job}")] = hs.answer(200, {"id": job, "deleted": True})
    peer = hs.HostileServer(routes)
    yield peer
    peer.close()


def test_batch_clips_are_decoded_while_they_download_like_a_single_job(server, noisy_mp4):
    reference = decode_mp4(noisy_mp4, bounds=bounds_for(W, H, F, {})).frames
    requests = [VideoRequest("a fox", width=W, height=H, num_frames=F, fps=16, steps=2, seed=s) for s in range(3)]
    with VideoClient(server.url) as client:
        result = run_batch(client, requests)
    assert result.frames.shape == (3 * F, H, W, 3)
    for i in range(3):
        assert np.array_equal(result.frames[result.clip_rows(i)], reference)
        assert result.clips[i].mp4 == noisy_mp4
        # the streamed path: the plain GET plus the index asked for on a second connection
        ranged = [e.headers.get("range") for e in server.calls("GET", f"/v1/videos/{JOBS[i]}/content")]
        assert sorted(ranged, key=str) == sorted([None, f"bytes=-{streamed_download.TAIL_BYTES}"], key=str)
        t = result.clips[i].timings
        assert t["job_done"] <= t["downloaded"] <= t["decoded"]
    assert [e.path for e in server.calls("DELETE")] == [f"/v1/videos/{job}" for job in JOBS]


def test_the_client_decodes_a_clip_into_rows_it_is_given(server, noisy_mp4):
    rows = np.empty((F, H, W, 3), dtype=np.float32)
    with VideoClient(server.url) as client:
        got = client.download_decoded("b0", bounds_for(W, H, F, {}), into=rows)
    assert got.video.frames is rows or np.shares_memory(got.video.frames, rows)
    assert got.mp4 == noisy_mp4
