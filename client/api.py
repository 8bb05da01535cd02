"""VideoClient: what a caller of one vLLM-Omni server asks for, and one job from submit to result.

The endpoints themselves (paths, job ids, which answers are a result) are video_jobs.py; this
module owns what a caller sees: a cancel as GenerationCancelled (deleted or not), the clip's
memory checked before the job is sent (clip_memory.py), and `generate`'s loop: submit, poll,
download while decoding (streamed_download.py; a server of ours on this machine: read from its
storage folder instead, local_result.py), delete the job on every way out, with timings.

`VideoClient.generate` polls every poll_interval (default 0.25 s), and fast only in a short
window around the job's expected end (poll_window.py: opened by the caller's `due()` hint, e.g.
the supervisor's log showing the last denoise step, or by what earlier jobs of the same kind
took on that server, which every caller gets), so a finished job is noticed within tens of
milliseconds without polling fast for long; cancellation is checked at least every 0.25 s.
"""
from __future__ import annotations

import threading
import time
from typing import Any, Callable, Optional

import numpy as np

from ..errors import LauncherError
from .bounds import ClipBounds, expected_shape
from .clip_memory import check_clip_memory
from .frames import DecodedVideo, PreparedOutput, VideoInfo, probe_mp4
from .http_errors import job_failed_error
from .job_results import GenerationCancelled, GenerationResult, JobState, JobUpdate
from .poll_window import LEARNED, Due, Hint, PollCadence, job_kind
from .request import VideoRequest
from .streamed_download import StreamedVideo
from .transport import Cancelled, Deadlines, RetryPolicy, Transport
from .video_jobs import VideoJobs, job_text, shown

# download() without a request to size it: 1280x720 x 121 frames at 16 bits per pixel, about 223 MB.
UNSIZED_DOWNLOAD_CAP = 256 << 20

REMOTE_LOG_HINT = ("check the log on the machine that runs the server (`serve` prints its path); queue the "
                   "prompt again once the server answers")
LOCAL_LOG_HINT = ("Server Status shows what happened and the log path; the launcher restarts a crashed server "
                  "by itself; queue the prompt again")

class VideoClient:
    """Client for one vLLM-Omni server. Not thread-safe; make one per worker/prompt.

    api_key is sent as `Authorization: Bearer` and never appears in repr, errors or logs.
    served_name is informational (from /v1/models); it is never sent with a job.
    deadlines: connect / first-byte / whole-body limits of every try (the local config's
    connect_timeout_s, first_byte_timeout_s, body_timeout_s: `Deadlines.from_config`); a
    wedged server is reported after retry.tries polls ran past the first-byte deadline.
    """

    def __init__(self, base_url: str, api_key: Optional[str] = None, served_name: Optional[str] = None,
                 server_version: tuple[int, int] = (0, 30), *, deadlines: Deadlines = Deadlines(),
                 retry: RetryPolicy = RetryPolicy(), sleep: Callable[[float], None] = time.sleep,
                 supervised: bool = False, log_hint: Optional[str] = None,
                 clip_memory_gib: Optional[float] = None, proxy: Optional[str] = None,
                 clock: Callable[[], float] = time.monotonic, storage_dir: Optional[str] = None) -> None:
        """`supervised`: this launcher started the server and looks after it (a Local Server, or the
        CLI's own), so a refused connection means it is not ready or has exited, never that the user
        must start it. `log_hint` is the fix given when the server stops answering mid-job: where this
        caller's user can read what happened (by default, for a supervised server Server Status and
        its log; for a remote one the log on its own machine). `clip_memory_gib`: max_clip_memory_gib.
        `proxy`: the local config's remote_proxy (transport.py: never one from the environment).
        `clock` (with `sleep`): the poll cadence's time, for tests that run a job's minutes in a moment.
        `storage_dir`: the job storage folder of a server this launcher started on this machine
        (Supervisor.storage_dir): a finished job's MP4 is read there instead of downloaded when it can
        be (local_result.py); None (remote servers): always downloaded."""
        if not base_url or "://" not in base_url:
            raise LauncherError(
                f"'{base_url}' is not a server URL", "it needs a scheme and host, like http://127.0.0.1:8091",
                "use the server handle from the loader node, or a full http(s):// URL", setting="server")
        self.base_url = base_url.rstrip("/")
        self.served_name = served_name
        self.server_version = tuple(server_version)[:2]
        self.log_hint = log_hint or (LOCAL_LOG_HINT if supervised else REMOTE_LOG_HINT)
        self.clip_memory_gib = clip_memory_gib
        self._http = Transport(self.base_url, api_key, deadlines=deadlines, retry=retry, proxy=proxy, sleep=sleep,
                               supervised=supervised)
        self._jobs = VideoJobs(self._http, self.base_url, storage_dir)
        self._clock = clock
        self._round_cadence: Optional[PollCadence] = None    # wait_for_next_poll's (a batch's poll rounds)

    def __repr__(self) -> str:
        return (f"VideoClient({self.base_url!r}, api_key={'set' if self._http.has_key else None}, "
                f"served_name={self.served_name!r}, server_version={self.server_version})")

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "VideoClient":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- one call each (video_jobs.py); a cancel is a GenerationCancelled ------------------------

    def health(self) -> bool:
        """True when GET /health answers 200 (no key needed). One short try, never raises."""
        return self._jobs.health()

    def models(self, *, should_cancel: Optional[Callable[[], bool]] = None) -> list[str]:
        """Served model names from GET /v1/models. A cancel during a read or a wait between tries
        raises transport.Cancelled (no job exists yet, so there is nothing to delete or explain)."""
        return self._jobs.models(should_cancel)

    def clip_bounds(self, req: VideoRequest, frame_multiplier: int = 1) -> ClipBounds:
        """req.bounds(), refused when its decoded frames could pass the per-clip memory cap
        (clip_memory.py): checked before a job whose frames are decoded is submitted."""
        return check_clip_memory(req.bounds(frame_multiplier), self.clip_memory_gib)

    def submit(self, req: VideoRequest, *, should_cancel: Optional[Callable[[], bool]] = None) -> str:
        """POST /v1/videos; returns the job id. Retried only when the connection failed before sending."""
        try:
            return self._jobs.submit(req, self.server_version, should_cancel)
        except Cancelled:
            raise GenerationCancelled("", "queued", deleted=True) from None

    def status(self, job_id: str, *, should_cancel: Optional[Callable[[], bool]] = None) -> JobState:
        """GET /v1/videos/{id}. A failed job (HTTP 500 + job body) is a JobState, not an error.
        Retries gateway errors; a cancel during a read or those waits raises GenerationCancelled."""
        try:
            return self._jobs.status(job_id, should_cancel)
        except Cancelled:
            raise GenerationCancelled(job_id, deleted=False) from None

    def download(self, job_id: str, *, max_bytes: int = UNSIZED_DOWNLOAD_CAP, cap_reason: str = "",
                 should_cancel: Optional[Callable[[], bool]] = None) -> bytes:
        """GET /v1/videos/{id}/content: at most max_bytes (a larger answer is refused; cap_reason
        says why it cannot be real), within the body deadline. A cancel raises
        GenerationCancelled without deleting the job."""
        try:
            return self._jobs.download(job_id, max_bytes, cap_reason, should_cancel).mp4
        except Cancelled:
            raise GenerationCancelled(job_id, "completed", deleted=False) from None

    def download_decoded(self, job_id: str, bounds: ClipBounds, *, into: Optional[np.ndarray] = None,
                         should_cancel: Optional[Callable[[], bool]] = None) -> StreamedVideo:
        """The MP4 of completed job `job_id` and its frames, decoded while it downloads
        (streamed_download.py): at most bounds.max_bytes, the stream checked against `bounds`
        before any frame is allocated; `into`: float32 [F, H, W, 3] rows made beforehand, used
        when the stream is exactly that shape. The one download + decode of a finished clip:
        `generate` and batches (batch.py) both use it. A cancel raises GenerationCancelled
        without deleting the job."""
        try:
            return self._jobs.download_decoded(job_id, bounds, into, should_cancel)
        except Cancelled:
            raise GenerationCancelled(job_id, "completed", deleted=False) from None

    def delete(self, job_id: str) -> bool:
        """DELETE /v1/videos/{id}, best effort: True when the job is gone (deleted or already
        unknown), False otherwise. Never raises. 409 "Cancellation in progress" is retried."""
        return self._jobs.delete(job_id)

    # -- generate -------------------------------------------------------------------------------

    def generate(self, req: VideoRequest, *, on_update: Optional[Callable[[JobUpdate], None]] = None,
                 should_cancel: Optional[Callable[[], bool]] = None, poll_interval: float = 0.25,
                 timeout_s: Optional[float] = None, keep_job: bool = False,
                 frame_multiplier: int = 1, due: Optional[Due] = None,
                 decode: bool = True) -> GenerationResult:
        """Submit, poll until done, download, decode, delete the job on the server.

        Polls every `poll_interval` seconds (sleeps never exceed it nor 0.25 s between
        should_cancel checks), and every poll_window.FAST_POLL_S inside the short window around
        the job's expected end: from each rise of `due()` (the caller's hint that the job is
        finishing, a poll_window.Hint level) or from what earlier jobs of this kind took on this
        server (poll_window.py), which the job then teaches. on_update gets a JobUpdate after every poll. When
        should_cancel() is true the job is deleted at once and GenerationCancelled raised.
        `timeout_s` (None: wait forever) bounds submit -> completion; on expiry the job is
        deleted and a LauncherError raised. The MP4 may be at most req.bounds() in size and
        shape (`frame_multiplier`: the frame interpolation factor, when `req.extra` turns
        interpolation on); anything else is refused before it is decoded. `decode=False`: only
        the MP4 is wanted (the CLI without --frames-npy): it is downloaded and its header checked
        against the request (frames.probe_mp4), no frame is decoded, and the result's video is None.

        timings (seconds, time.monotonic based, relative to just before the submit):
          submit      POST answered (job id known)
          job_done    first poll that saw the job completed
          downloaded  MP4 bytes in hand (the decode runs meanwhile: streamed_download.py; or read from
                      the server's folder, then decoded: local_result.py)
          decoded     frames and bytes in hand (decoded - downloaded: the decode left after the last byte);
                      with decode=False: the header checked
          read_wait   (decoded only) a duration: how long the decoder waited for bytes not yet downloaded
          disk_read   (when the MP4 was read from the server's storage folder, not downloaded) a duration:
                      that read
          queued      time the job was seen queued (duration)
          running     time the job was seen in progress (duration)
          detect_delay  (when the server reports completed_at) wall-clock seconds from the
                        server's completion stamp to our detection; upstream truncates
                        completed_at to whole seconds, so this over-states by up to 1 s
          server_inference  (when reported) the server's inference_time_s: its task time,
                        engine queueing included
          stored_hint   (when `due()` rose to Hint.STORED) a duration: from that rise to the poll
                        that saw the job done (how late a supervised server's completion is seen)
        """
        poll = max(0.01, float(poll_interval))
        bounds = self.clip_bounds(req, frame_multiplier) if decode else req.bounds(frame_multiplier)
        t0 = time.monotonic()
        if should_cancel is not None and should_cancel():
            raise GenerationCancelled("", "queued", deleted=True)
        job_id = self.submit(req, should_cancel=should_cancel)
        t_submit = time.monotonic() - t0
        timings: dict[str, float] = {"submit": t_submit}
        queued_s = running_s = 0.0
        last_status, last_t = "queued", time.monotonic()
        state: Optional[JobState] = None
        cleanup = not keep_job   # delete the job on the way out (unless the server is gone)
        shape = expected_shape(bounds) if decode else None
        prepared: Optional[PreparedOutput] = None
        kind = job_kind(req)
        cadence = PollCadence(poll, due, LEARNED.get(self.base_url, kind), self._clock)
        deleter: Optional[threading.Thread] = None

        def delete_early() -> None:
            """The MP4 is in hand: the job's DELETE runs while its frames are decoded (or its header
            checked), off the caller's path; it is joined before generate returns, on every way out."""
            nonlocal cleanup, deleter
            if cleanup:
                cleanup = False
                deleter = threading.Thread(target=self.delete, args=(job_id,), name="vllm-omni-delete", daemon=True)
                deleter.start()

        try:
            while True:
                if should_cancel is not None and should_cancel():
                    raise Cancelled()
                try:
                    state = self._jobs.status(job_id, should_cancel)
                except LauncherError as exc:
                    lost = self._lost(job_id, last_status, exc)
                    cleanup = cleanup and lost is exc and "no longer knows" not in exc.what
                    raise lost from None
                now = time.monotonic()
                # Time since the last poll is counted in the state seen at that poll.
                if last_status == "queued":
                    queued_s += now - last_t
                else:
                    running_s += now - last_t
                last_status, last_t = state.status, now
                if on_update is not None:
                    on_update(JobUpdate(job_id, state.status, queued_s, running_s))
                if state.status == "in_progress":
                    cadence.running(self._clock())
                if state.status == "completed":
                    run_s, after_hint = cadence.finished(self._clock())
                    LEARNED.learn(self.base_url, kind, run_s, after_hint)
                    if Hint.STORED in after_hint:
                        timings["stored_hint"] = after_hint[Hint.STORED]
                    break
                if state.status == "failed":
                    raise self.job_failure(job_id, state)
                if timeout_s is not None and now - t0 > timeout_s:
                    self.delete(job_id)
                    cleanup = False
                    raise LauncherError(
                        f"Job {shown(job_id)} did not finish within {timeout_s:g} s",
                        f"it was still {state.status.replace('_', ' ')} on the server; the launcher deleted it",
                        "raise the time limit, lower steps/frames/size, or check the server log for a hang",
                        setting="timeout")
                if prepared is None and shape is not None and cadence.near_end():
                    prepared = PreparedOutput(*shape)   # the frames' memory, touched while the GPU finishes
                cadence.wait(self._http.sleep, should_cancel)
            timings["job_done"] = time.monotonic() - t0
            timings["queued"], timings["running"] = queued_s, running_s
            if state.completed_at is not None:
                timings["detect_delay"] = max(0.0, time.time() - state.completed_at)
            if isinstance(state.raw.get("inference_time_s"), (int, float)):
                timings["server_inference"] = float(state.raw["inference_time_s"])
            video: Optional[DecodedVideo] = None
            probed: Optional[VideoInfo] = None
            if decode:
                got = self._jobs.download_decoded(job_id, bounds, prepared.take() if prepared is not None else None,
                                                  should_cancel, on_downloaded=delete_early)
                mp4, video = got.mp4, got.video
                timings["downloaded"], timings["decoded"] = got.downloaded_at - t0, got.decoded_at - t0
                timings["read_wait"] = got.read_wait_s
                disk_read_s = got.disk_read_s
            else:
                fetched = self._jobs.download(job_id, bounds.max_bytes, bounds.cap_reason, should_cancel)
                mp4, disk_read_s = fetched.mp4, fetched.disk_read_s
                timings["downloaded"] = time.monotonic() - t0
                delete_early()
                probed = probe_mp4(mp4, bounds=bounds)
                timings["decoded"] = time.monotonic() - t0
            if disk_read_s is not None:
                timings["disk_read"] = disk_read_s
        except Cancelled:
            status = state.status if state is not None else "queued"
            deleted = self.delete(job_id)
            cleanup = False
            raise GenerationCancelled(job_id, status, deleted) from None
        finally:
            # Also on errors and on foreign exceptions (e.g. ComfyUI's interrupt raised from on_update).
            if prepared is not None:
                prepared.drop()
            if cleanup:
                self.delete(job_id)
            if deleter is not None:
                deleter.join()
        return GenerationResult(job_id, mp4, video, timings, state.raw, probed)

    def job_failure(self, job_id: str, state: JobState) -> LauncherError:
        """The error for job `job_id` (our id, not the server's echo), which the server reports
        failed: upstream's reason explained, its raw answer with this client's key redacted (the
        one place single jobs and batches build it)."""
        return job_failed_error(job_id, state.error or "", self._http.redact(job_text(state)),
                                state.error_code)

    def wait_for_next_poll(self, poll: float, due: Optional[Due],
                           should_cancel: Optional[Callable[[], bool]]) -> None:
        """Sleep until the next poll round of a caller's own loop (a batch): `poll` seconds, and
        fast only in the short window each rise of `due()` opens (poll_window.py). The cadence
        lives as long as the same `due` and interval are passed; its hint rises once per clip and
        level, so its number of windows is not capped (each window still is)."""
        cadence = self._round_cadence
        if cadence is None or cadence.due is not due or cadence.poll_s != poll:
            cadence = self._round_cadence = PollCadence(poll, due, clock=self._clock, max_windows=None)
        cadence.wait(self._http.sleep, should_cancel)

    def _lost(self, job_id: str, last_status: str, exc: LauncherError) -> LauncherError:
        """A poll failed for good: name the job and what the server was doing."""
        kind = exc.kind
        tries = self._http.retry.tries
        if kind == "refused":
            why = (f"its port refuses connections now ({tries} tries over "
                   f"{sum(self._http.retry.delays()):g} s), so the server process exited: it crashed "
                   "(GPU error, out of memory in a worker) or was stopped")
        elif kind == "timeout":
            why = (f"{tries} status requests in a row got no answer within "
                   f"{self._http.deadlines.first_byte_s:g} s: the server is wedged or the machine is overloaded "
                   "(if it is only slow, raise first_byte_timeout_s in the launcher's local config)")
        elif kind == "lost":
            why = "the connection was cut repeatedly: the server crashed or restarted, or the network failed"
        else:
            return exc
        return LauncherError(
            f"The vLLM-Omni server stopped answering while job {shown(job_id)} was "
            f"{last_status.replace('_', ' ')}",
            why, self.log_hint, setting="server", raw=exc.raw)


__all__ = [
    "VideoRequest", "VideoClient", "RetryPolicy", "Deadlines",
]
