"""The streamed download against the real vLLM-Omni 0.30 HTTP layer (stub engine): upstream's
/content (Starlette FileResponse) says `Accept-Ranges: bytes` and answers the suffix range the
video client asks for the MP4's index, and the frames decoded while downloading are the frames
of download-then-decode."""
from __future__ import annotations

from typing import Any

import numpy as np

import frame_code
from shared_stubs import TI2V_OFFLOAD
from vllm_omni_launcher.client import streamed_download
from vllm_omni_launcher.client.api import VideoClient, VideoRequest
from vllm_omni_launcher.client.frames import decode_mp4
from vllm_omni_launcher.client.transport import ONE_TRY, Transport

W, H, FRAMES, SEED = 256, 128, 17, 5


def test_upstream_content_serves_the_range_tail_and_streamed_frames_match(stub_pool, monkeypatch):
    with stub_pool.lease(TI2V_OFFLOAD) as (stub,):
        with VideoClient(stub.url) as client:
            req = VideoRequest("a fox", width=W, height=H, num_frames=FRAMES, fps=16, steps=2, seed=SEED)
            done = client.generate(req, keep_job=True)
            path = f"/v1/videos/{done.job_id}/content"
            try:
                with Transport(stub.url) as http:
                    whole = http.request("GET", path, what="whole", large_body=True, max_body=64 << 20)
                    tail = http.request("GET", path, what="tail", headers={"Range": "bytes=-100"},
                                        ok=lambda s: s == 206, retry=ONE_TRY)
                    size = len(whole.body)
                    assert whole.headers.get("Accept-Ranges") == "bytes"
                    assert tail.headers["Content-Range"] == f"bytes {size - 100}-{size - 1}/{size}"
                    assert tail.body == whole.body[-100:]
                    asked: list[Any] = []
                    real_request = http.request

                    def spying(*args: Any, **kwargs: Any) -> Any:
                        asked.append(kwargs.get("headers"))
                        return real_request(*args, **kwargs)

                    monkeypatch.setattr(http, "request", spying)
                    monkeypatch.setattr(streamed_download, "TAIL_MIN_BYTES", 0)   # the stub's clips are small
                    got = streamed_download.download_decoding(
                        http, path, what="streamed", job_id=done.job_id, max_bytes=64 << 20, cap_reason="",
                        bounds=req.bounds())
            finally:
                client.delete(done.job_id)
    assert {"Range": f"bytes=-{streamed_download.TAIL_BYTES}"} in asked
    assert got.mp4 == whole.body == done.mp4
    assert np.array_equal(got.video.frames, decode_mp4(whole.body, bounds=req.bounds()).frames)
    assert [frame_code.decode(f) for f in got.video.frames] == [(i, SEED) for i in range(FRAMES)]
