"""The vLLM-Omni /v1/videos client: submit a Wan2.2 job, poll it, download and decode the MP4.

Upstream facts this follows (vllm-omni-serving.md section 4):

* `POST /v1/videos` takes multipart/form-data only and returns a queued job; the job runs
  asynchronously. `num_frames` and `fps` are always sent (omitting them gives a 1-frame clip
  at 24 fps). `model` is never sent (a mismatch is a 400 and the server knows its model).
* `GET /v1/videos/{id}` has no progress (0 -> 100 at the end); a failed job answers with
  its body and a non-2xx status (usually 500).
* `GET /v1/videos/{id}/content` is the H.264 MP4. `DELETE /v1/videos/{id}` removes a job;
  on a queued or running job it may answer 409 "Cancellation in progress" for a while.
  DELETE cannot stop a Wan denoise that already started: the GPU stays busy until it ends.
* 0.26 takes `fps` as an int, 0.30 as a float >= 1.

`VideoClient.generate` polls in <= poll_interval (default 0.25 s) slices, so a finished job
is noticed within a quarter second, and cancellation is checked at least every 0.25 s.
"""
from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import requests

from ..errors import LauncherError
from .frames import DecodedVideo, decode_mp4
from .http import (
    RETRY_STATUSES,
    Cancelled,
    RetryPolicy,
    Transport,
    error_message,
    http_error,
    job_failed_error,
    parse_body,
    sleep_checking,
    unreachable_error,
)

log = logging.getLogger(__name__)

STATUSES = ("queued", "in_progress", "completed", "failed")
DOWNLOAD_CHUNK = 1 << 20


# ----------------------------------------------------------------------------- request

@dataclass
class VideoRequest:
    """One Wan2.2 generation. None means "let the server decide" and is not sent.

    `num_frames` and `fps` are always sent. `image_png` (PNG bytes, see frames.image_to_png)
    is uploaded as `input_reference` for I2V / TI2V. `extra` holds further raw form fields
    for advanced use (e.g. {"extra_params": '{"sample_solver": "euler"}'}); it may not carry
    `model`.
    """

    prompt: str
    negative_prompt: Optional[str] = None
    width: Optional[int] = None
    height: Optional[int] = None
    num_frames: int = 81
    fps: float = 16.0
    steps: Optional[int] = None
    guidance: Optional[float] = None
    guidance_2: Optional[float] = None
    boundary_ratio: Optional[float] = None
    flow_shift: Optional[float] = None
    seed: Optional[int] = None
    image_png: Optional[bytes] = field(default=None, repr=False)
    extra: dict[str, str] = field(default_factory=dict)

    def form_fields(self, server_version: tuple[int, int] = (0, 30)) -> dict[str, Any]:
        """The multipart form: str values are text fields; `input_reference` is a
        (filename, bytes, content type) file part. Raises LauncherError for values the
        server version cannot take."""
        fps = _check_fps(self.fps, server_version)
        if self.num_frames is None or int(self.num_frames) < 1:
            raise LauncherError(
                f"frames {self.num_frames} is not valid",
                "a video needs at least one frame, and the launcher always sends the frame count "
                "(without it vLLM-Omni makes a 1-frame clip)",
                "set frames to 4k+1, e.g. 81", setting="frames")
        values: dict[str, Any] = {
            "prompt": self.prompt,
            "negative_prompt": self.negative_prompt,
            "width": _int_or_none(self.width),
            "height": _int_or_none(self.height),
            "num_frames": int(self.num_frames),
            "fps": fps,
            "num_inference_steps": _int_or_none(self.steps),
            "guidance_scale": self.guidance,
            "guidance_scale_2": self.guidance_2,
            "boundary_ratio": self.boundary_ratio,
            "flow_shift": self.flow_shift,
            "seed": _int_or_none(self.seed),
        }
        form: dict[str, Any] = {k: _form_text(v) for k, v in values.items() if v is not None}
        for key, value in self.extra.items():
            if key == "model":
                raise LauncherError(
                    "The request may not name the model",
                    "vLLM-Omni answers 400 'Model mismatch' when the form's model differs from the one "
                    "it serves, and it can only run the model it loaded",
                    "remove 'model' from the extra form fields", setting="extra")
            if value is not None:
                form[key] = _form_text(value)
        if self.image_png is not None:
            form["input_reference"] = ("image.png", bytes(self.image_png), "image/png")
        return form


def _check_fps(fps: Any, server_version: tuple[int, int]) -> str:
    try:
        value = float(fps)
    except (TypeError, ValueError):
        value = float("nan")
    if not math.isfinite(value) or value < 1:
        raise LauncherError(
            f"fps {fps} is not valid",
            "vLLM-Omni needs a frame rate of at least 1 (it only sets the MP4's rate; Wan does not use it)",
            "set fps to 16 (A14B models) or 24 (TI2V-5B)", setting="fps")
    if value.is_integer():
        return str(int(value))
    if tuple(server_version) < (0, 30):
        ver = ".".join(str(p) for p in server_version)
        raise LauncherError(
            f"fps {value:g} is not possible with vLLM-Omni {ver}",
            "versions before 0.30 take the frame rate as a whole number",
            f"set fps to {round(value)}, or use vLLM-Omni 0.30 or newer", setting="fps")
    return repr(value)


def _int_or_none(value: Any) -> Optional[int]:
    return None if value is None else int(value)


def _form_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return repr(value)  # "4.0": keeps float fields unambiguous
    return str(value)


# ----------------------------------------------------------------------------- results

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
    """A finished job. timings: see VideoClient.generate."""

    job_id: str
    mp4: bytes = field(repr=False)
    video: DecodedVideo
    timings: dict[str, float]
    job: dict[str, Any] = field(default_factory=dict, repr=False)


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
        super().__init__(f"Job {job_id} was cancelled" if job_id else "The video job was cancelled",
                         why, fix, setting="", raw=raw)


# ----------------------------------------------------------------------------- client

class VideoClient:
    """Client for one vLLM-Omni server. Not thread-safe; make one per worker/prompt.

    api_key is sent as `Authorization: Bearer` and never appears in repr, errors or logs.
    served_name is informational (from /v1/models); it is never sent with a job.
    timeout / poll_timeout: (connect, read) seconds for ordinary calls / status polls; a
    wedged server is reported after retry.tries polls time out.
    """

    def __init__(self, base_url: str, api_key: Optional[str] = None, served_name: Optional[str] = None,
                 server_version: tuple[int, int] = (0, 30), *, retry: RetryPolicy = RetryPolicy(),
                 timeout: tuple[float, float] = (5.0, 30.0), poll_timeout: tuple[float, float] = (3.0, 10.0),
                 sleep: Callable[[float], None] = time.sleep) -> None:
        if not base_url or "://" not in base_url:
            raise LauncherError(
                f"'{base_url}' is not a server URL", "it needs a scheme and host, like http://127.0.0.1:8091",
                "use the server handle from the loader node, or a full http(s):// URL", setting="server")
        self.base_url = base_url.rstrip("/")
        self.served_name = served_name
        self.server_version = tuple(server_version)[:2]
        self.poll_timeout = poll_timeout
        self._http = Transport(self.base_url, api_key, retry=retry, timeout=timeout, sleep=sleep)

    def __repr__(self) -> str:
        return (f"VideoClient({self.base_url!r}, api_key={'set' if self._http.has_key else None}, "
                f"served_name={self.served_name!r}, server_version={self.server_version})")

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "VideoClient":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- simple calls ---------------------------------------------------------------------------

    def health(self) -> bool:
        """True when GET /health answers 200 (no key needed). One try, no retries, never raises."""
        try:
            resp = self._http.session.get(self.base_url + "/health", timeout=(2.0, 5.0))
            resp.close()
            return resp.status_code == 200
        except requests.exceptions.RequestException:
            return False

    def models(self) -> list[str]:
        """Served model names from GET /v1/models."""
        resp = self._http.request("GET", "/v1/models", what="Listing the served models")
        body = parse_body(resp.text) or {}
        data = body.get("data") if isinstance(body, dict) else None
        return [str(m.get("id")) for m in data or [] if isinstance(m, dict) and m.get("id")]

    def submit(self, req: VideoRequest, *, should_cancel: Optional[Callable[[], bool]] = None) -> str:
        """POST /v1/videos; returns the job id. Retried only when the connection failed before sending."""
        form = req.form_fields(self.server_version)
        files = {k: (v if isinstance(v, tuple) else (None, v)) for k, v in form.items()}
        try:
            resp = self._http.request("POST", "/v1/videos", what="Submitting the video job", idempotent=False,
                                      files=files, should_cancel=should_cancel)
        except Cancelled:
            raise GenerationCancelled("", "queued", deleted=True) from None
        body = parse_body(resp.text)
        job_id = body.get("id") if isinstance(body, dict) else None
        if not job_id:
            raise LauncherError(
                "The server accepted the job but returned no job id",
                "the answer to POST /v1/videos was not a vLLM-Omni video job",
                "check that the URL points at vLLM-Omni (vllm serve ... --omni)", setting="server",
                raw=self._http.redact(resp.text[:4000]))
        return str(job_id)

    def status(self, job_id: str, *, should_cancel: Optional[Callable[[], bool]] = None) -> JobState:
        """GET /v1/videos/{id}. A failed job (HTTP 500 + job body) is a JobState, not an error.
        Retries gateway errors; a cancel during those waits raises GenerationCancelled."""
        try:
            return self._status(job_id, should_cancel)
        except Cancelled:
            raise GenerationCancelled(job_id, deleted=False) from None

    def _status(self, job_id: str, should_cancel: Optional[Callable[[], bool]]) -> JobState:
        resp = self._http.request(
            "GET", f"/v1/videos/{job_id}", what=f"Checking job {job_id}", job_id=job_id,
            ok=lambda s: s < 300 or (s >= 400 and s not in RETRY_STATUSES), should_cancel=should_cancel,
            timeout=self.poll_timeout)
        text = self._http.redact(resp.text)
        body = parse_body(text)
        if isinstance(body, dict) and body.get("status") in STATUSES and (200 <= resp.status_code < 300
                                                                          or body.get("status") == "failed"):
            err = body.get("error")
            message = error_message({"error": err}, "") if err else None
            return JobState(str(body.get("id") or job_id), str(body["status"]), message or None,
                            err.get("code") if isinstance(err, dict) else None, resp.status_code, body)
        if 200 <= resp.status_code < 300:
            raise LauncherError(
                f"The server's answer about job {job_id} is not a video job",
                f"GET /v1/videos/{job_id} returned an unexpected body", "check the server version",
                setting="server", raw=text[:4000])
        raise http_error(resp.status_code, text, what=f"Checking job {job_id}", base_url=self.base_url,
                         sent_key=self._http.has_key, job_id=job_id)

    def download(self, job_id: str, *, should_cancel: Optional[Callable[[], bool]] = None) -> bytes:
        """GET /v1/videos/{id}/content, streamed in 1 MiB chunks (cancel checked per chunk;
        a cancel raises GenerationCancelled without deleting the job)."""
        try:
            return self._download(job_id, should_cancel)
        except Cancelled:
            raise GenerationCancelled(job_id, "completed", deleted=False) from None

    def _download(self, job_id: str, should_cancel: Optional[Callable[[], bool]]) -> bytes:
        attempts = self._http.retry.tries
        for attempt in range(1, attempts + 1):
            resp = self._http.request(
                "GET", f"/v1/videos/{job_id}/content", what=f"Downloading job {job_id}", job_id=job_id,
                stream=True, should_cancel=should_cancel, timeout=(5.0, 60.0))
            try:
                size = int(resp.headers.get("Content-Length") or 0)
                chunks: list[bytes] = []
                for chunk in resp.iter_content(DOWNLOAD_CHUNK):
                    if should_cancel is not None and should_cancel():
                        raise Cancelled()
                    chunks.append(chunk)
                data = b"".join(chunks)
                if size and len(data) != size:
                    raise requests.exceptions.ChunkedEncodingError(f"got {len(data)} of {size} bytes")
                return data
            except (requests.exceptions.ChunkedEncodingError, requests.exceptions.ConnectionError,
                    requests.exceptions.Timeout) as exc:
                if attempt == attempts:
                    raise unreachable_error(self.base_url, exc, tries=attempt) from None
                sleep_checking(self._http.retry.delays()[attempt - 1], should_cancel, self._http.sleep)
            finally:
                resp.close()
        raise AssertionError("unreachable")  # pragma: no cover

    def delete(self, job_id: str, *, conflict_tries: int = 5, conflict_wait_s: float = 1.0) -> bool:
        """DELETE /v1/videos/{id}, best effort: True when the job is gone (deleted or already
        unknown), False otherwise. Never raises. 409 "Cancellation in progress" is retried."""
        for attempt in range(1, conflict_tries + 1):
            try:
                resp = self._http.request(
                    "DELETE", f"/v1/videos/{job_id}", what=f"Deleting job {job_id}", job_id=job_id,
                    ok=lambda s: s < 300 or s in (404, 409), timeout=(3.0, 15.0),
                    retry=RetryPolicy(tries=3, base_s=0.25, max_s=1.0))
            except LauncherError as exc:
                log.warning("Could not delete job %s: %s", job_id, exc.what)
                return False
            code = resp.status_code
            resp.close()
            if code < 300 or code == 404:
                return True
            if attempt < conflict_tries:
                self._http.sleep(conflict_wait_s)
        log.warning("Job %s: the server still reports 'cancellation in progress'", job_id)
        return False

    # -- generate -------------------------------------------------------------------------------

    def generate(self, req: VideoRequest, *, on_update: Optional[Callable[[JobUpdate], None]] = None,
                 should_cancel: Optional[Callable[[], bool]] = None, poll_interval: float = 0.25,
                 timeout_s: Optional[float] = None, keep_job: bool = False) -> GenerationResult:
        """Submit, poll until done, download, decode, delete the job on the server.

        Polls every `poll_interval` seconds (sleeps never exceed it nor 0.25 s between
        should_cancel checks). on_update gets a JobUpdate after every poll. When
        should_cancel() is true the job is deleted at once and GenerationCancelled raised.
        `timeout_s` (None: wait forever) bounds submit -> completion; on expiry the job is
        deleted and a LauncherError raised.

        timings (seconds, time.monotonic based, relative to just before the submit):
          submit      POST answered (job id known)
          job_done    first poll that saw the job completed
          downloaded  MP4 bytes in hand
          decoded     frames in hand
          queued      time the job was seen queued (duration)
          running     time the job was seen in progress (duration)
          detect_delay  (when the server reports completed_at) wall-clock seconds from the
                        server's completion stamp to our detection; upstream truncates
                        completed_at to whole seconds, so this over-states by up to 1 s
          server_inference  (when reported) the server's inference_time_s: its task time,
                        engine queueing included
        """
        poll = max(0.01, float(poll_interval))
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
        try:
            while True:
                if should_cancel is not None and should_cancel():
                    raise Cancelled()
                try:
                    state = self._status(job_id, should_cancel)
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
                if state.status == "completed":
                    break
                if state.status == "failed":
                    raise job_failed_error(job_id, state.error or "", self._http.redact(_job_text(state)),
                                           state.error_code)
                if timeout_s is not None and now - t0 > timeout_s:
                    self.delete(job_id)
                    cleanup = False
                    raise LauncherError(
                        f"Job {job_id} did not finish within {timeout_s:g} s",
                        f"it was still {state.status.replace('_', ' ')} on the server; the launcher deleted it",
                        "raise the time limit, lower steps/frames/size, or check the server log for a hang",
                        setting="timeout")
                sleep_checking(poll, should_cancel, self._http.sleep)
            timings["job_done"] = time.monotonic() - t0
            timings["queued"], timings["running"] = queued_s, running_s
            if state.completed_at is not None:
                timings["detect_delay"] = max(0.0, time.time() - state.completed_at)
            if isinstance(state.raw.get("inference_time_s"), (int, float)):
                timings["server_inference"] = float(state.raw["inference_time_s"])
            mp4 = self._download(job_id, should_cancel)
            timings["downloaded"] = time.monotonic() - t0
            video = decode_mp4(mp4)
            timings["decoded"] = time.monotonic() - t0
        except Cancelled:
            status = state.status if state is not None else "queued"
            deleted = self.delete(job_id)
            cleanup = False
            raise GenerationCancelled(job_id, status, deleted) from None
        finally:
            # Also on errors and on foreign exceptions (e.g. ComfyUI's interrupt raised from on_update).
            if cleanup:
                self.delete(job_id)
        return GenerationResult(job_id, mp4, video, timings, state.raw)

    def _lost(self, job_id: str, last_status: str, exc: LauncherError) -> LauncherError:
        """A poll failed for good: name the job and what the server was doing."""
        kind = getattr(exc, "kind", "")
        tries = self._http.retry.tries
        if kind == "refused":
            why = (f"its port refuses connections now ({tries} tries over "
                   f"{sum(self._http.retry.delays()):g} s), so the server process exited: it crashed "
                   "(GPU error, out of memory in a worker) or was stopped")
        elif kind == "timeout":
            why = (f"{tries} status requests in a row got no answer within {self.poll_timeout[1]:g} s: "
                   "the server is wedged or the machine is overloaded")
        elif kind == "lost":
            why = "the connection was cut repeatedly: the server crashed or restarted, or the network failed"
        else:
            return exc
        return LauncherError(
            f"The vLLM-Omni server stopped answering while job {job_id} was {last_status.replace('_', ' ')}",
            why,
            "check the server log (the launcher node shows its tail); restart the server and queue the "
            "prompt again", setting="server", raw=exc.raw)


def _job_text(state: JobState) -> str:
    import json  # noqa: PLC0415

    try:
        return f"HTTP {state.http_status}: " + json.dumps(state.raw)
    except (TypeError, ValueError):
        return str(state.raw)


__all__ = [
    "VideoRequest", "VideoClient", "JobState", "JobUpdate", "GenerationResult", "GenerationCancelled",
    "RetryPolicy",
]
