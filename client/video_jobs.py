"""The /v1/videos endpoints, one HTTP exchange each: what is sent, which answers are a result.

Upstream facts this follows (checked against the 0.30 wheel's HTTP layer):

* `POST /v1/videos` (multipart, see request.py) returns a queued job; the job runs
  asynchronously.
* `GET /v1/videos/{id}` has no progress (0 -> 100 at the end); a failed job answers with
  its body and a non-2xx status (usually 500).
* `GET /v1/videos/{id}/content` is the H.264 MP4. `DELETE /v1/videos/{id}` removes a job;
  on a queued or running job it may answer 409 "Cancellation in progress" for a while.
  DELETE cannot stop a Wan denoise that already started: the GPU stays busy until it ends.

The server is untrusted: its job ids are URL-quoted into one path segment (an all-dots id is
refused) and shown stripped and capped; its bodies are parsed within bounds (server_json.py).
A cancel during a call comes out as transport.Cancelled, unchanged: what a cancel means for the
job (deleted or not, which status) is the caller's to say (api.py).
"""
from __future__ import annotations

import dataclasses
import json
import logging
import time
from typing import Callable, Optional
from urllib.parse import quote

import numpy as np

from ..errors import LauncherError
from ..errors.redact import untrusted_text
from .bounds import ClipBounds
from .http_errors import ID_LIMIT, RETRY_STATUSES, error_message, http_error, model_ids, parse_body
from .job_results import JobState
from .local_result import FetchedMp4, decode_stored, read_stored
from .request import VideoRequest
from .streamed_download import StreamedVideo, download_decoding
from .transport import ONE_TRY, Deadlines, RetryPolicy, Transport

log = logging.getLogger(__name__)

STATUSES = ("queued", "in_progress", "completed", "failed")
# DELETE repeats 409 "Cancellation in progress" too; short waits, and a short first-byte
# deadline: it runs on the cancel path, where the user is waiting.
DELETE_RETRY = RetryPolicy(tries=5, base_s=0.25, max_s=1.0)
DELETE_FIRST_BYTE_S = 5.0
HEALTH_DEADLINES = Deadlines(connect_s=2.0, first_byte_s=5.0, body_s=5.0)


class VideoJobs:
    """The endpoints of one server, over its Transport (retries, deadlines, key redaction). `storage_dir`: that
    server's job storage folder when the launcher started it on this machine; a finished job's MP4 is then read
    there rather than downloaded, whenever it can be (local_result.py), and downloaded otherwise."""

    def __init__(self, http: Transport, base_url: str, storage_dir: Optional[str] = None) -> None:
        self._http = http
        self.base_url = base_url
        self.storage_dir = storage_dir

    def health(self) -> bool:
        """True when GET /health answers 200 (no key needed). One short try, never raises."""
        try:
            return self._http.request("GET", "/health", what="Checking the server's health", ok=lambda s: True,
                                      retry=ONE_TRY, deadlines=HEALTH_DEADLINES).status == 200
        except LauncherError:
            return False

    def models(self, should_cancel: Optional[Callable[[], bool]] = None) -> list[str]:
        """Served model names from GET /v1/models."""
        reply = self._http.request("GET", "/v1/models", what="Listing the served models",
                                   should_cancel=should_cancel)
        return model_ids(parse_body(reply.text)) or []

    def submit(self, req: VideoRequest, server_version: tuple[int, ...],
               should_cancel: Optional[Callable[[], bool]]) -> str:
        """POST /v1/videos; the job id. Retried only when the connection failed before sending."""
        form = req.form_fields(server_version)
        files = {k: (v if isinstance(v, tuple) else (None, v)) for k, v in form.items()}
        reply = self._http.request("POST", "/v1/videos", what="Submitting the video job", idempotent=False,
                                   files=files, should_cancel=should_cancel)
        body = parse_body(reply.text)
        job_id = body.get("id") if isinstance(body, dict) else None
        if not job_id or not isinstance(job_id, (str, int)):
            raise LauncherError(
                "The server accepted the job but returned no job id",
                "the answer to POST /v1/videos was not a vLLM-Omni video job",
                "check that the URL points at vLLM-Omni (vllm serve ... --omni)", setting="server",
                raw=untrusted_text(self._http.redact(reply.text)))
        return str(job_id)

    def status(self, job_id: str, should_cancel: Optional[Callable[[], bool]]) -> JobState:
        """GET /v1/videos/{id}. A failed job (HTTP 500 + job body) is a JobState, not an error;
        gateway errors are retried."""
        what = f"Checking job {shown(job_id)}"
        reply = self._http.request(
            "GET", job_path(job_id), what=what, job_id=job_id,
            ok=lambda s: s < 300 or (s >= 400 and s not in RETRY_STATUSES), should_cancel=should_cancel)
        text = self._http.redact(reply.text)
        body = parse_body(text)
        if isinstance(body, dict) and body.get("status") in STATUSES and (200 <= reply.status < 300
                                                                          or body.get("status") == "failed"):
            err = body.get("error")
            message = error_message({"error": err}, "") if err else None
            return JobState(str(body.get("id") or job_id), str(body["status"]), message or None,
                            err.get("code") if isinstance(err, dict) else None, reply.status, body)
        if 200 <= reply.status < 300:
            raise LauncherError(
                f"The server's answer about job {shown(job_id)} is not a video job",
                "GET /v1/videos/{id} returned an unexpected body", "check the server version",
                setting="server", raw=untrusted_text(text))
        raise http_error(reply.status, text, what=what, base_url=self.base_url, sent_key=self._http.has_key,
                         job_id=job_id)

    def download(self, job_id: str, max_bytes: int, cap_reason: str,
                 should_cancel: Optional[Callable[[], bool]]) -> FetchedMp4:
        """The MP4: from the server's folder when it can be read there (local_result.py), else
        GET /v1/videos/{id}/content: at most max_bytes, within the body deadline."""
        stored = read_stored(self.storage_dir, job_id, max_bytes, should_cancel)
        if stored is not None:
            return stored
        body = self._http.request(
            "GET", job_path(job_id, "/content"), what=_download_what(job_id), job_id=job_id,
            large_body=True, max_body=max_bytes, cap_reason=cap_reason, should_cancel=should_cancel).body
        return FetchedMp4(body, time.monotonic())

    def download_decoded(self, job_id: str, bounds: ClipBounds, into: Optional[np.ndarray],
                         should_cancel: Optional[Callable[[], bool]],
                         on_downloaded: Optional[Callable[[], None]] = None) -> StreamedVideo:
        """The content decoded while it downloads (streamed_download.py), or decoded from the server's folder
        (local_result.py), checked against `bounds`; `on_downloaded` runs once its last byte is in (the decode
        may still be going)."""
        stored = read_stored(self.storage_dir, job_id, bounds.max_bytes, should_cancel)
        if stored is not None:
            return decode_stored(stored, bounds, into, on_downloaded)
        return download_decoding(self._http, job_path(job_id, "/content"), what=_download_what(job_id),
                                 job_id=job_id, max_bytes=bounds.max_bytes, cap_reason=bounds.cap_reason,
                                 bounds=bounds, should_cancel=should_cancel, into=into, on_downloaded=on_downloaded)

    def delete(self, job_id: str) -> bool:
        """DELETE /v1/videos/{id}, best effort: True when the job is gone (deleted or already
        unknown), False otherwise. Never raises. 409 "Cancellation in progress" is retried."""
        deadlines = dataclasses.replace(self._http.deadlines,
                                        first_byte_s=min(self._http.deadlines.first_byte_s, DELETE_FIRST_BYTE_S))
        try:
            self._http.request("DELETE", job_path(job_id), what=f"Deleting job {shown(job_id)}",
                               job_id=job_id, ok=lambda s: s < 300 or s == 404,
                               retry_statuses=RETRY_STATUSES | {409}, retry=DELETE_RETRY, deadlines=deadlines)
        except LauncherError as exc:
            log.warning("Could not delete job %s: %s", shown(job_id), exc.what)
            return False
        return True


def job_path(job_id: str, tail: str = "") -> str:
    """/v1/videos/<id><tail> with the server-provided id quoted into exactly one path segment
    ("../x?y" -> "..%2Fx%3Fy"). An id of only dots ("", ".", "..") cannot be one: HTTP clients
    resolve it as a dot segment (requests even turns %2E back into "."), so it is refused."""
    segment = quote(str(job_id), safe="")
    if segment.strip(".") == "":
        raise LauncherError(
            f"The server handed out an unusable job id {shown(repr(str(job_id)))}",
            "an empty or all-dots id would address another URL than the job's, so vLLM-Omni never uses one; "
            "the server is misbehaving or is not vLLM-Omni",
            "check which program answers at the server URL", setting="server")
    return f"/v1/videos/{segment}{tail}"


def shown(job_id: str) -> str:
    """A server-given job id as our texts show it (stripped, capped)."""
    return untrusted_text(str(job_id), ID_LIMIT)


def job_text(state: JobState) -> str:
    """A job poll's answer as raw text for an error (before the key is redacted)."""
    try:
        return f"HTTP {state.http_status}: " + json.dumps(state.raw)
    except (TypeError, ValueError):
        return str(state.raw)


def _download_what(job_id: str) -> str:
    return f"Downloading job {shown(job_id)}"
