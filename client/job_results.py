"""What the /v1/videos client (client/api.py) hands back: one poll of a job, a progress update,
a finished job with its decoded video, and the cancel error.

Kept apart from the polling loop so callers (the node session, benches, tests) name the results
without the HTTP machinery; `GenerationCancelled` is a LauncherError so it reads like every other
failure, with the GPU-still-busy caveat in its own words.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from ..errors import LauncherError
from ..errors.redact import strip_control
from .frames import DecodedVideo, VideoInfo


@dataclass
class JobState:
    """One poll of GET /v1/videos/{id}. `raw` is the server's job object."""

    job_id: str
    status: str                       # queued | in_progress | completed | failed
    error: Optional[str] = None       # failed jobs: the server's error message
    error_code: Any = None
    http_status: int = 200
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def done(self) -> bool:
        return self.status in ("completed", "failed")

    @property
    def completed_at(self) -> Optional[float]:
        value = self.raw.get("completed_at")
        return float(value) if isinstance(value, (int, float)) else None


@dataclass(frozen=True)
class JobUpdate:
    """Sent to on_update after each poll: time spent queued and running so far (seconds)."""

    job_id: str
    status: str
    queued_s: float
    running_s: float


@dataclass
class GenerationResult:
    """A finished job. timings: see VideoClient.generate. `video` is None when the caller asked
    for the MP4 only (generate(decode=False)); `info` (size, frames, fps) is always there."""

    job_id: str
    mp4: bytes = field(repr=False)
    video: Optional[DecodedVideo]
    timings: dict[str, float]
    job: dict[str, Any] = field(default_factory=dict, repr=False)
    probed: Optional[VideoInfo] = None

    @property
    def info(self) -> VideoInfo:
        if self.video is not None:
            return self.video.info
        assert self.probed is not None, "a result without frames carries its probe"
        return self.probed


class GenerationCancelled(LauncherError):
    """should_cancel() turned true: the job was deleted on the server (best effort).

    job_id is "" when the cancel came before the server assigned one; status is the last
    status seen ("queued" / "in_progress"); deleted says whether the server confirmed it."""

    def __init__(self, job_id: str, status: str = "", deleted: bool = True, raw: str = "") -> None:
        self.job_id, self.status, self.deleted = job_id, status, deleted
        if status == "queued":
            why = "the prompt was interrupted while the job was still queued; it never reached the GPU"
            fix = "queue the prompt again when you want the video"
        else:
            why = ("the prompt was interrupted. A Wan denoise that has already started keeps the GPU busy "
                   "until it ends: vLLM-Omni cannot abort it, it only drops the result")
            fix = ("wait for the GPU to finish before the next job starts, or restart the server from the "
                   "launcher to free it at once")
        if not deleted:
            why += "; the server did not confirm the deletion"
        if not job_id:
            why = "the prompt was interrupted before the job reached the server"
            fix = "queue the prompt again when you want the video"
        super().__init__(f"Job {strip_control(job_id)} was cancelled" if job_id else "The video job was cancelled",
                         why, fix, setting="", raw=raw)
