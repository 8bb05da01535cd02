"""Several /v1/videos jobs in one go: submit them all, poll them, decode each as it completes.

Why all at once: vLLM-Omni queues what it is sent. Requests that differ only in prompt and
seed are what 0.30's request batching may run in one forward (`--max-num-seqs` > 1, with
`--request-batch-max-wait-ms` to gather them); a server with replicas runs them side by side;
otherwise they run one after the other with no gap. Sending one job at a time would give up
the first two and add a round trip per clip. The server decides; we only keep it fed.

Everything goes through `VideoClient` (api.py): its submit, status, delete, its one download +
decode of a finished clip (`download_decoded`: the MP4 decoded while it arrives, as for one job),
and its one poll cadence (`wait_for_next_poll`: the poll interval, fast polling while `due()`,
cancel checks in 0.25 s slices). No HTTP of our own.

Memory: a batch is memory, so its size is capped by the caller (the local config's
`max_batch_clips`), every clip by the client's per-clip memory cap (`clip_bounds`, checked for
every request before the first is submitted: clip_memory.py), and all clips together by the same
cap (check_batch_memory, also before the first submit): the frames of all clips go into
one [n x F, H, W, 3] float32 array. Where the requests fix the clip's shape exactly
(bounds.expected_shape, the same for every request) it is allocated before the first download
and every clip is decoded straight into its rows;
otherwise the first clip is decoded on its own, fixes the shape and is copied in, the later ones
decode into their rows. A clip of another shape is decoded on its own and refused (all clips go
out as one IMAGE batch). Each clip is decoded as soon as it completes, checked against its
request (bounds.py), so at most one clip's frames exist beside the result. Its job is deleted on
the server once its MP4 is in hand.

One deadline: `timeout_s` bounds the whole batch from the first submit (None: wait forever, as
a single job does). A cancel, an error or the deadline deletes every job not yet deleted:
queued ones first (so none of them starts while we are at it), then the running ones.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import numpy as np

from ..errors import LauncherError
from .bounds import ClipBounds, expected_shape
from .clip_memory import check_batch_memory
from .job_results import GenerationCancelled, JobState
from .request import VideoRequest
from .transport import Cancelled

DONE = "done"     # a clip's status once its MP4 is downloaded and decoded (and its job deleted)


@dataclass(frozen=True)
class BatchUpdate:
    """Sent to on_update after each round of polls: every clip's status, in request order
    (queued | in_progress | completed | done), and the seconds since the first submit."""

    statuses: tuple[str, ...]
    elapsed_s: float

    @property
    def done(self) -> int:
        return self.statuses.count(DONE)

    @property
    def running(self) -> int:
        return self.statuses.count("in_progress")


@dataclass
class Clip:
    """One finished clip: its job, the server's MP4 (untouched), its shape and timings
    (seconds from the first submit: job_done, downloaded, decoded)."""

    index: int
    job_id: str
    mp4: bytes = field(repr=False)
    num_frames: int
    height: int
    width: int
    fps: float
    timings: dict[str, float]


@dataclass
class BatchResult:
    """All clips, in request order. `frames` is [sum of frames, H, W, 3] float32 0..1, clip i
    at rows clip_rows(i); `most_at_once` is the most jobs one poll round saw in_progress together
    (above 1: they overlapped, which a job's VAE decode and MP4 encode beside the next one's denoise
    does too, so it is no proof of request batching or replicas)."""

    frames: np.ndarray = field(repr=False)
    clips: list[Clip]
    most_at_once: int
    elapsed_s: float

    def clip_rows(self, index: int) -> slice:
        start = sum(c.num_frames for c in self.clips[:index])
        return slice(start, start + self.clips[index].num_frames)


class BatchCancelled(LauncherError):
    """should_cancel() turned true: every job of the batch was deleted (best effort).
    `jobs`: (job id, last status seen) of the jobs that were still on the server;
    `deleted`: whether the server confirmed every deletion."""

    def __init__(self, jobs: Sequence[tuple[str, str]], deleted: bool, clips_done: int, total: int) -> None:
        self.jobs, self.deleted, self.clips_done = tuple(jobs), deleted, clips_done
        running = sum(1 for _, status in self.jobs if status == "in_progress")
        why = (f"the prompt was interrupted after {clips_done} of {total} clips; the launcher deleted the "
               f"{len(self.jobs)} job(s) still on the server")
        if running:
            why += (". A Wan denoise that has already started keeps the GPU busy until it ends: vLLM-Omni "
                    "cannot abort it, it only drops the result")
        if not deleted:
            why += "; the server did not confirm every deletion"
        super().__init__("The batch was cancelled", why, "queue the prompt again when you want the clips")


def run_batch(client: Any, requests: Sequence[VideoRequest], *,
              on_update: Optional[Callable[[BatchUpdate], None]] = None,
              should_cancel: Optional[Callable[[], bool]] = None, due: Optional[Callable[[], bool]] = None,
              poll_interval: float = 0.25, timeout_s: Optional[float] = None) -> BatchResult:
    """Submit every request, poll until all are done, download and decode each as it completes.

    `client` is a VideoClient (or anything with its clip_bounds / submit / status / download_decoded /
    delete / wait_for_next_poll, job_failure and clip_memory_gib). `due()`: some job should be
    finishing now (poll fast). A failed job, a clip of another shape than the first, or the deadline
    raises LauncherError; a cancel raises BatchCancelled. Either way no job of the batch is left on the server."""
    if not requests:
        raise ValueError("run_batch needs at least one request")
    bounds = [client.clip_bounds(req) for req in requests]      # each clip's memory checked before any is sent
    check_batch_memory(bounds, client.clip_memory_gib)          # and the one array of all clips
    run = _Batch(client, list(requests), bounds, should_cancel, time.monotonic())
    try:
        run.submit_all()
        run.poll_until_done(on_update, due, max(0.01, float(poll_interval)), timeout_s)
    except (Cancelled, GenerationCancelled):
        left, deleted = run.delete_left()
        raise BatchCancelled(left, deleted, run.statuses.count(DONE), len(requests)) from None
    finally:
        run.delete_left()        # errors, the deadline, foreign exceptions (a no-op after a cancel)
    return run.result()


class _Batch:
    """The state of one run_batch call: the jobs, their statuses, the frames so far."""

    def __init__(self, client: Any, requests: list[VideoRequest], bounds: list[ClipBounds],
                 should_cancel: Optional[Callable[[], bool]], t0: float) -> None:
        self.client, self.requests, self.should_cancel, self.t0 = client, requests, should_cancel, t0
        self.bounds = bounds
        self.jobs: list[str] = []
        self.statuses = ["queued"] * len(requests)
        self.clips: list[Optional[Clip]] = [None] * len(requests)
        self.frames: Optional[np.ndarray] = None
        self.most_at_once = 0
        self._deleted: set[int] = set()

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def submit_all(self) -> None:
        for req in self.requests:
            if self.should_cancel is not None and self.should_cancel():
                raise Cancelled()
            self.jobs.append(self.client.submit(req, should_cancel=self.should_cancel))

    def poll_until_done(self, on_update: Optional[Callable[[BatchUpdate], None]], due: Optional[Callable[[], bool]],
                        poll: float, timeout_s: Optional[float]) -> None:
        while True:
            if self.should_cancel is not None and self.should_cancel():
                raise Cancelled()
            for i in self._pending():
                state = self.client.status(self.jobs[i], should_cancel=self.should_cancel)
                self.statuses[i] = state.status
                if state.status == "failed":
                    raise self._failed(i, state)
            self.most_at_once = max(self.most_at_once, self.statuses.count("in_progress"))
            for i in self._pending():
                if self.statuses[i] == "completed":
                    self._collect(i)
            if on_update is not None:
                on_update(BatchUpdate(tuple(self.statuses), self.elapsed()))
            if not self._pending():
                return
            if timeout_s is not None and self.elapsed() > timeout_s:
                raise LauncherError(
                    f"The batch did not finish within {timeout_s:g} s",
                    f"{self.statuses.count(DONE)} of {len(self.jobs)} clips were done; the launcher deleted the rest",
                    "raise the time limit, make fewer or smaller clips, or check the server log for a hang",
                    setting="timeout")
            self.client.wait_for_next_poll(poll, due, self.should_cancel)

    def _pending(self) -> list[int]:
        return [i for i, status in enumerate(self.statuses) if status != DONE]

    def _failed(self, i: int, state: JobState) -> LauncherError:
        err = self.client.job_failure(self.jobs[i], state)
        return LauncherError(f"Clip {i + 1}/{len(self.jobs)}: {err.what}", err.why, err.fix, setting=err.setting,
                             raw=err.raw, kind=err.kind, raw_label=err.raw_label)

    def _collect(self, i: int) -> None:
        """Download clip i, decode it into its slot of the batch's frames, delete its job."""
        job_id = self.jobs[i]
        timings = {"job_done": self.elapsed()}
        # decoded while it downloads, straight into its rows once their shape is known
        got = self.client.download_decoded(job_id, self.bounds[i], into=self._slot(i),
                                           should_cancel=self.should_cancel)
        timings["downloaded"], timings["decoded"] = got.downloaded_at - self.t0, got.decoded_at - self.t0
        video = got.video
        self._place(i, video.frames)
        self.clips[i] = Clip(i, job_id, got.mp4, video.num_frames, video.height, video.width, video.fps, timings)
        del video, got                      # its frames now live in the batch's array only
        self.statuses[i] = DONE
        self._deleted.add(i)
        self.client.delete(job_id)

    def _slot(self, i: int) -> Optional[np.ndarray]:
        """Clip i's rows of the batch's frames; the frames are allocated here from the requests'
        expected shape when it is known (None until the first clip fixed their shape otherwise)."""
        if self.frames is None:
            shape = self._expected()
            if shape is None:
                return None
            self.frames = np.empty((len(self.requests) * shape[0], *shape[1:], 3), dtype=np.float32)
        per_clip = self.frames.shape[0] // len(self.requests)
        return self.frames[i * per_clip:(i + 1) * per_clip]

    def _expected(self) -> Optional[tuple[int, int, int]]:
        """(frames, height, width) every request of the batch fixes exactly; None where one leaves
        it to the server or two ask for different shapes (then the first clip decides)."""
        shapes = {expected_shape(bounds) for bounds in self.bounds}
        return shapes.pop() if len(shapes) == 1 else None

    def _place(self, i: int, frames: np.ndarray) -> None:
        n = len(self.requests)
        if self.frames is None:
            self.frames = np.empty((n * frames.shape[0], *frames.shape[1:]), dtype=np.float32)
        first = next((c for c in self.clips if c is not None), None)
        per_clip = self.frames.shape[0] // n
        if frames.shape != (per_clip, *self.frames.shape[1:]):
            raise LauncherError(
                f"The clips of the batch differ in size: clip {i + 1} is {_shape(frames.shape)}, "
                + (f"clip {first.index + 1} is " if first is not None else "the requests asked for ")
                + _shape((per_clip, *self.frames.shape[1:])),
                "the frames of all clips go out as one IMAGE batch, which needs one size and frame count; every "
                "request asked for the same, so the server changed one of them",
                "set width, height and frames to explicit values (not 0), or make these clips with Generate "
                "Video one at a time", setting="width")
        if not np.shares_memory(frames, self.frames):     # decoded on its own: no rows yet, or not their shape
            self.frames[i * per_clip:(i + 1) * per_clip] = frames

    def delete_left(self) -> tuple[list[tuple[str, str]], bool]:
        """DELETE every job of the batch not deleted yet, queued ones first. Returns (job id,
        status) of those and whether the server confirmed all."""
        left = [i for i in range(len(self.jobs)) if i not in self._deleted]
        left.sort(key=lambda i: self.statuses[i] != "queued")       # stable: queued first, in order
        confirmed = True
        for i in left:
            self._deleted.add(i)
            confirmed = self.client.delete(self.jobs[i]) and confirmed
        return [(self.jobs[i], self.statuses[i]) for i in left], confirmed

    def result(self) -> BatchResult:
        clips = [c for c in self.clips if c is not None]
        assert self.frames is not None and len(clips) == len(self.requests)
        return BatchResult(self.frames, clips, self.most_at_once, self.elapsed())


def _shape(shape: tuple[int, ...]) -> str:
    return f"{shape[0]} frames {shape[2]}x{shape[1]}"


__all__ = ["BatchCancelled", "BatchResult", "BatchUpdate", "Clip", "run_batch"]
