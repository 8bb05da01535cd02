"""client/batch.py: several jobs submitted at once, polled, decoded as each completes, all deleted.

The server here is a fake *client* (FakeClient): it plays a scripted vLLM-Omni job queue at the
interface run_batch uses (clip_bounds / submit / status / download_decoded / delete / job_failure /
wait_for_next_poll), and the first test checks that interface against the real VideoClient's, so the fake cannot drift from
it. Its MP4s are real H.264 clips (frame_code frames: each decoded frame says its index and seed).
Where the requests fix the clip's shape (bounds.expected_shape), the batch's rows exist before the
first download and every clip, the first included, decodes straight into its rows; a clip decoded
elsewhere is still copied in, and a clip of another shape is refused before it is decoded.
"""
from __future__ import annotations

import inspect
import time
import tracemalloc
from typing import Any, Callable, Optional

import numpy as np
import pytest

import frame_code
from clips import encode_clip

from vllm_omni_launcher.client.api import VideoClient
from vllm_omni_launcher.client.http_errors import job_failed_error
from vllm_omni_launcher.client.batch import BatchCancelled, BatchUpdate, run_batch
from vllm_omni_launcher.client.bounds import ClipBounds, expected_shape
from vllm_omni_launcher.client.clip_memory import check_clip_memory
from vllm_omni_launcher.client.frames import decode_mp4
from vllm_omni_launcher.client.job_results import GenerationCancelled, JobState
from vllm_omni_launcher.client.request import FrameInterpolation, VideoRequest
from vllm_omni_launcher.client.streamed_download import StreamedVideo
from vllm_omni_launcher.client.transport import sleep_checking
from vllm_omni_launcher.errors import LauncherError

W, H, F = 64, 32, 5


def request(seed: int, prompt: str = "a fox") -> VideoRequest:
    return VideoRequest(prompt, width=W, height=H, num_frames=F, fps=16, steps=3, seed=seed)


class FakeClient:
    """A scripted job queue. `script[i]` is the status job i shows at each poll round (the
    last one repeats); `shape[i]` overrides the (frames, width, height) of job i's MP4."""

    def __init__(self, script: list[list[str]], shape: Optional[dict[int, tuple[int, int, int]]] = None,
                 cancel_at_round: Optional[int] = None) -> None:
        self.script, self.shape = script, shape or {}
        self.calls: list[tuple[str, str]] = []
        self.seeds: dict[str, int] = {}
        self.polls: dict[str, int] = {}
        self.deleted: list[str] = []
        self.caps: dict[str, int] = {}
        self.rounds = 0
        self.cancel_at_round = cancel_at_round
        self.clip_memory_gib: Optional[float] = None

    def clip_bounds(self, req: VideoRequest, frame_multiplier: int = 1) -> ClipBounds:
        return check_clip_memory(req.bounds(frame_multiplier), self.clip_memory_gib)    # the real client's check

    def submit(self, req: VideoRequest, *, should_cancel: Optional[Callable[[], bool]] = None) -> str:
        job = f"job-{len(self.seeds)}"
        self.seeds[job] = int(req.seed)
        self.calls.append(("submit", job))
        return job

    def status(self, job_id: str, *, should_cancel: Optional[Callable[[], bool]] = None) -> JobState:
        if job_id in self.deleted:
            raise LauncherError(f"The server no longer knows job {job_id}")
        i = int(job_id.split("-")[1])
        n = self.polls.get(job_id, 0)
        self.polls[job_id] = n + 1
        steps = self.script[i]
        status = steps[min(n, len(steps) - 1)]
        self.calls.append(("status", job_id))
        if status == "failed":
            return JobState(job_id, "failed", "engine blew up", None, 500, {"id": job_id, "status": "failed"})
        return JobState(job_id, status, raw={"id": job_id, "status": status})

    def download_decoded(self, job_id: str, bounds: ClipBounds, *, into: Optional[np.ndarray] = None,
                         should_cancel: Optional[Callable[[], bool]] = None) -> StreamedVideo:
        self.calls.append(("download", job_id))
        self.caps[job_id] = bounds.max_bytes
        frames, width, height = self.shape.get(int(job_id.split("-")[1]), (F, W, H))
        mp4 = encode_clip(frames, width, height, seed=self.seeds[job_id])
        video = decode_mp4(mp4, bounds=bounds, into=into)         # the real client decodes as it downloads
        now = time.monotonic()
        return StreamedVideo(mp4, video, now, now)

    def delete(self, job_id: str) -> bool:
        self.calls.append(("delete", job_id))
        self.deleted.append(job_id)
        return True

    def job_failure(self, job_id: str, state: JobState) -> LauncherError:
        return job_failed_error(job_id, state.error or "", str(state.raw), state.error_code)

    def wait_for_next_poll(self, poll: float, due: Optional[Callable[[], bool]],
                            should_cancel: Optional[Callable[[], bool]]) -> None:
        self.rounds += 1
        if self.cancel_at_round is not None and self.rounds >= self.cancel_at_round:
            sleep_checking(0.0, lambda: True)     # what the real wait does when Cancel is pending


def test_the_fake_client_has_the_real_clients_interface():
    for name in ("clip_bounds", "submit", "status", "download_decoded", "delete", "job_failure", "wait_for_next_poll"):
        fake, real = inspect.signature(getattr(FakeClient, name)), inspect.signature(getattr(VideoClient, name))
        fake_params = [(p.name, p.kind) for p in fake.parameters.values()]
        real_params = [(p.name, p.kind) for p in real.parameters.values()]
        assert all(p in real_params for p in fake_params), (name, fake_params, real_params)
        required = [(p.name, p.kind) for p in real.parameters.values() if p.default is p.empty]
        assert all(p in fake_params for p in required), (name, required)


def seeds_of(frames: Any) -> list[tuple[int, int]]:
    return [frame_code.decode(f) for f in frames]


def test_every_job_is_submitted_before_the_first_poll_and_clips_return_in_request_order():
    # job 2 finishes first, then 0, then 1 (replicas or a batched wave can do that)
    client = FakeClient([["queued", "in_progress", "completed"], ["queued", "queued", "in_progress", "completed"],
                         ["in_progress", "completed"]])
    updates: list[BatchUpdate] = []
    result = run_batch(client, [request(10), request(11), request(12)], on_update=updates.append)
    first_poll = next(i for i, (what, _) in enumerate(client.calls) if what == "status")
    assert [c for c in client.calls[:first_poll]] == [("submit", f"job-{i}") for i in range(3)]
    assert result.frames.shape == (3 * F, H, W, 3) and result.frames.dtype.name == "float32"
    assert seeds_of(result.frames) == [(i, s) for s in (10, 11, 12) for i in range(F)]
    assert [c.job_id for c in result.clips] == ["job-0", "job-1", "job-2"]
    assert [seeds_of(result.frames[result.clip_rows(i)])[0] for i in range(3)] == [(0, 10), (0, 11), (0, 12)]
    assert [u.done for u in updates] == [0, 1, 2, 3] and updates[1].statuses == ("in_progress", "queued", "done")
    assert sorted(client.deleted) == ["job-0", "job-1", "job-2"]


def test_each_clip_is_downloaded_and_its_job_deleted_as_soon_as_it_completes():
    client = FakeClient([["in_progress", "completed"], ["queued", "queued", "in_progress", "completed"]])
    run_batch(client, [request(1), request(2)])
    calls = client.calls
    # job-0's MP4 is fetched (and the job deleted) while job-1 is still being polled
    assert calls.index(("download", "job-0")) < calls.index(("delete", "job-0")) < max(
        i for i, c in enumerate(calls) if c == ("status", "job-1"))
    assert client.polls == {"job-0": 2, "job-1": 4}        # a done job is not polled again


def test_most_at_once_says_whether_the_server_ran_jobs_together():
    together = FakeClient([["in_progress", "completed"]] * 3)
    assert run_batch(together, [request(1), request(2), request(3)]).most_at_once == 3
    queued = FakeClient([["in_progress", "completed"], ["queued", "in_progress", "completed"]])
    assert run_batch(queued, [request(1), request(2)]).most_at_once == 1


def test_downloads_are_capped_by_each_requests_bounds():
    client = FakeClient([["completed"]])
    run_batch(client, [request(3)])
    assert client.caps == {"job-0": request(3).bounds().max_bytes}


def test_the_result_is_one_array_and_decoding_holds_at_most_one_clip_beside_it():
    n, frames, width, height = 4, 9, 256, 128        # 1.2 MB per clip: well above the allowance for buffers
    client = FakeClient([["completed"]] * n, shape={i: (frames, width, height) for i in range(n)})
    clip_bytes = frames * height * width * 3 * 4
    reqs = [VideoRequest("a fox", width=width, height=height, num_frames=frames, fps=16, seed=s) for s in range(n)]
    tracemalloc.start()
    try:
        result = run_batch(client, reqs)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert result.frames.nbytes == n * clip_bytes and result.frames.flags.c_contiguous
    # decoded clips gathered and then concatenated would peak at 2 x n clips
    assert peak < (n + 1.5) * clip_bytes + (256 << 10), peak


def test_cancel_deletes_every_job_left_queued_ones_first():
    # round 1: job-0 running, jobs 1 and 2 queued; then Cancel
    client = FakeClient([["in_progress"], ["queued"], ["queued"]], cancel_at_round=1)
    with pytest.raises(BatchCancelled) as info:
        run_batch(client, [request(1), request(2), request(3)])
    err = info.value
    assert client.deleted == ["job-1", "job-2", "job-0"]          # queued before running: none of them starts
    assert err.jobs == (("job-1", "queued"), ("job-2", "queued"), ("job-0", "in_progress"))
    assert err.deleted and err.clips_done == 0 and "cannot abort" in err.why and "deleted the 3 job" in err.why


def test_cancel_after_some_clips_deletes_only_what_is_left():
    client = FakeClient([["completed"], ["in_progress"], ["queued"]], cancel_at_round=1)
    with pytest.raises(BatchCancelled) as info:
        run_batch(client, [request(1), request(2), request(3)])
    assert client.deleted == ["job-0", "job-2", "job-1"] and info.value.clips_done == 1
    assert "after 1 of 3 clips" in info.value.why


def test_cancel_during_a_read_is_a_batch_cancel_too():
    class CancelInRead(FakeClient):
        def status(self, job_id: str, *, should_cancel: Optional[Callable[[], bool]] = None) -> JobState:
            if job_id == "job-1":
                raise GenerationCancelled(job_id, deleted=False)   # what VideoClient.status raises
            return super().status(job_id, should_cancel=should_cancel)

    client = CancelInRead([["in_progress"], ["queued"]])
    with pytest.raises(BatchCancelled):
        run_batch(client, [request(1), request(2)])
    assert sorted(client.deleted) == ["job-0", "job-1"]


def test_cancel_before_anything_was_sent_submits_nothing():
    client = FakeClient([["queued"]])
    with pytest.raises(BatchCancelled) as info:
        run_batch(client, [request(1), request(2)], should_cancel=lambda: True)
    assert client.calls == [] and info.value.jobs == ()


def test_a_failed_job_names_its_clip_and_no_job_is_left():
    client = FakeClient([["in_progress"], ["failed"], ["queued"]])
    with pytest.raises(LauncherError) as info:
        run_batch(client, [request(1), request(2), request(3)])
    assert info.value.what.startswith("Clip 2/3: ") and "engine blew up" in info.value.text()
    assert sorted(client.deleted) == ["job-0", "job-1", "job-2"]


def test_clips_of_different_sizes_are_refused_with_the_fix():
    # what a server that changes one clip's frame count looks like (within that request's bounds)
    client = FakeClient([["completed"], ["completed"]], shape={1: (F + 4, W, H)})
    reqs = [request(1), VideoRequest("a fox", width=W, height=H, num_frames=F + 4, fps=16, steps=3, seed=2)]
    with pytest.raises(LauncherError) as info:
        run_batch(client, reqs)
    err = info.value
    assert "differ in size" in err.what and "clip 2 is 9 frames 64x32" in err.what and "clip 1 is 5 frames" in err.what
    assert "width, height and frames" in err.fix and err.setting == "width"
    assert sorted(client.deleted) == ["job-0", "job-1"]


def test_one_deadline_for_the_whole_batch_deletes_every_job():
    client = FakeClient([["completed"], ["in_progress"], ["queued"]])
    with pytest.raises(LauncherError) as info:
        run_batch(client, [request(1), request(2), request(3)], timeout_s=0.0)
    assert "did not finish within 0 s" in info.value.what and "1 of 3 clips" in info.value.why
    assert sorted(client.deleted) == ["job-0", "job-1", "job-2"]


def test_an_empty_batch_is_a_programming_error():
    with pytest.raises(ValueError):
        run_batch(FakeClient([]), [])


# ---- every clip decodes into its rows ---------------------------------------------------------------------
class Targets(FakeClient):
    """FakeClient that records, per download, the rows it was given and the array it decoded into.
    `ignore_into`: decode elsewhere (what decode_mp4 does when the stream's header does not say the rows' shape)."""

    def __init__(self, *args, ignore_into: bool = False, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.ignore_into = ignore_into
        self.targets: list[tuple[str, Optional[np.ndarray], np.ndarray]] = []

    def download_decoded(self, job_id: str, bounds: ClipBounds, *, into: Optional[np.ndarray] = None,
                         should_cancel: Optional[Callable[[], bool]] = None) -> StreamedVideo:
        got = super().download_decoded(job_id, bounds, into=None if self.ignore_into else into,
                                       should_cancel=should_cancel)
        self.targets.append((job_id, into, got.video.frames))
        return got


def test_the_first_clip_of_a_batch_decodes_straight_into_the_batchs_rows():
    # job 1 completes first: the first clip decoded is not clip 0
    client = Targets([["in_progress", "completed"], ["completed"], ["queued", "in_progress", "completed"]])
    result = run_batch(client, [request(10), request(11), request(12)])
    assert [job for job, _, _ in client.targets] == ["job-1", "job-0", "job-2"]
    for job, into, decoded in client.targets:
        i = int(job.split("-")[1])
        assert into is not None and into.base is result.frames          # the batch's own buffer, from the start
        assert decoded is into                                            # decoded there: nothing to copy
        assert np.shares_memory(decoded, result.frames[result.clip_rows(i)])
    assert seeds_of(result.frames) == [(f, s) for s in (10, 11, 12) for f in range(F)]


def test_a_clip_decoded_elsewhere_is_copied_into_its_rows():
    client = Targets([["completed"], ["completed"]], ignore_into=True)
    result = run_batch(client, [request(1), request(2)])
    assert all(into is not None and not np.shares_memory(decoded, result.frames)
               for _, into, decoded in client.targets)
    assert seeds_of(result.frames) == [(f, s) for s in (1, 2) for f in range(F)]


def test_requests_that_leave_the_shape_to_the_server_fix_it_with_the_first_clip():
    reqs = [VideoRequest("a fox", num_frames=F, fps=16, steps=3, seed=s) for s in (1, 2)]   # no size sent
    client = Targets([["completed"], ["in_progress", "completed"]])
    result = run_batch(client, reqs)
    (_, first_into, first), (_, second_into, second) = client.targets
    assert first_into is None and not np.shares_memory(first, result.frames)        # decoded on its own, copied
    assert second_into is not None and second is second_into and np.shares_memory(second, result.frames)
    assert result.frames.shape == (2 * F, H, W, 3)
    assert seeds_of(result.frames) == [(f, s) for s in (1, 2) for f in range(F)]


def test_a_clip_of_another_shape_than_its_rows_is_refused_before_it_is_decoded():
    # every request fixes 5 frames 64x32, so the rows exist before the first download; the server's
    # clip 0 has 9 frames: its bounds refuse it (as for any request) and no job is left
    client = Targets([["completed"], ["in_progress"]], shape={0: (F + 4, W, H)})
    with pytest.raises(LauncherError) as info:
        run_batch(client, [request(1), request(2)])
    assert "does not match the request" in info.value.what and f"{W}x{H}x{F + 4}" in info.value.what
    assert sorted(client.deleted) == ["job-0", "job-1"]


def test_the_expected_shape_is_the_bounds_one_clip_only():
    assert expected_shape(request(1).bounds()) == (F, H, W)
    assert expected_shape(VideoRequest("x", width=W, height=H, num_frames=F + 1).bounds()) is None     # rounded
    assert expected_shape(VideoRequest("x", num_frames=F).bounds()) is None                            # no size
    interpolated = VideoRequest("x", width=W, height=H, num_frames=F, interpolation=FrameInterpolation("/m"))
    assert expected_shape(interpolated.bounds()) is None            # (F-1)*2+1 .. 2F frames: not one count
    frames, height, width = expected_shape(request(1).bounds())
    rows = np.empty((frames, height, width, 3), dtype=np.float32)
    client = FakeClient([["completed"]])
    client.seeds["job-0"] = 1
    got = client.download_decoded("job-0", request(1).bounds(), into=rows)
    assert got.video.frames is rows                                 # decode_mp4 takes rows of exactly this shape
