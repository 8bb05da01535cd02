"""The one HTTP layer: a session, bounded retries, deadlines on every read, cancel within 1 s.

Everything the launcher asks a vLLM-Omni server (the video client's submit, status, download,
delete, models, health, and the supervisor's probes) goes through `Transport.request`.

Policy (modelled on ComfyUI's own API nodes):

* Connection errors and HTTP 408/429/502/503/504 are retried with exponential backoff
  (`RetryPolicy`: 5 tries, 0.5 s doubling, capped at 4 s); a call may add statuses (DELETE
  adds 409 "cancellation in progress"). Other 4xx are never retried. A request that must not
  run twice (job submit) is retried only when the connection failed before anything was sent.
* `Deadlines` bound each try: `connect_s` to open the connection, `first_byte_s` from then
  until the status line and headers are in (and, for small JSON answers, the whole body),
  `body_s` for a video download's body. A server that trickles one byte at a time cannot
  stretch them: they are wall-clock limits, not per-`recv` timeouts.
* Blocking reads cannot be interrupted in `requests`, so each try runs on a short-lived worker
  thread while the caller waits in 0.1 s slices, checking `should_cancel` and the deadlines;
  a stopped try has its TCP socket shut down, which ends the blocked read at once
  (abortable.py). A cancel therefore ends any read within about 0.1 s.
* Bodies are read raw (no gzip: we ask for `identity`) into at most `max_body` bytes; a larger
  Content-Length is refused before reading. Redirects are not followed. A download may go to a
  `BodySink` instead of into the Reply, chunk by chunk as it arrives (client/body_buffer.py: the
  video client decodes the MP4 while it downloads).
* Waits between tries are cut into <= 0.25 s slices that check `should_cancel`.
* The API key is sent as a Bearer header and scrubbed from every error and log line.
* Nothing else rides along: the session never trusts the environment (`trust_env` off), so
  ~/.netrc credentials (which `requests` would send as Basic auth, replacing our Bearer key) and
  HTTP(S)_PROXY / ALL_PROXY are never read. The one proxy is the one the local config names
  (`remote_proxy`), used for remote servers only, never for a loopback one in any spelling
  (hosts.py). A CA bundle named by REQUESTS_CA_BUNDLE / CURL_CA_BUNDLE is still honoured: it
  decides whom we trust, and sends nothing.
"""
from __future__ import annotations

import http.client
import logging
import os
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Protocol

import requests
import urllib3

from ..errors.config_names import env_var
from .abortable import AbortableAdapter, Attempt, run_try
from .hosts import is_loopback_url
from .exchange_errors import deadline_error, not_sent, redact, too_large_error, unreachable_error
from .http_errors import RETRY_STATUSES, http_error

log = logging.getLogger(__name__)

CANCEL_CHECK_S = 0.25          # longest sleep between should_cancel checks while backing off
SMALL_BODY_LIMIT = 1 << 20     # JSON answers (job status, model list): far above any real one
ERROR_BODY_LIMIT = 64 << 10    # an error answer is read this far for its message, then cut
CHUNK = 1 << 20                # read size of a body
SINK_CHUNK = 256 << 10         # read size of a body going to a BodySink: a read returns once it is full,
                               # and a decoder waiting on the sink should not wait for a whole MiB


@dataclass(frozen=True)
class RetryPolicy:
    """Bounded exponential backoff: `tries` attempts, `base_s` doubling, each wait <= `max_s`."""

    tries: int = 5
    base_s: float = 0.5
    factor: float = 2.0
    max_s: float = 4.0

    def delays(self) -> list[float]:
        """The waits between attempts (len = tries - 1)."""
        return [min(self.max_s, self.base_s * self.factor ** i) for i in range(max(0, self.tries - 1))]


ONE_TRY = RetryPolicy(tries=1)


@dataclass(frozen=True)
class Deadlines:
    """Wall-clock limits of one try (seconds); local config keys connect_timeout_s,
    first_byte_timeout_s and body_timeout_s set them."""

    connect_s: float = 5.0
    first_byte_s: float = 30.0
    body_s: float = 600.0

    @classmethod
    def from_config(cls, config: Any) -> "Deadlines":
        """The deadlines a LocalConfig names."""
        return cls(float(config.connect_timeout_s), float(config.first_byte_timeout_s),
                   float(config.body_timeout_s))


@dataclass(frozen=True)
class Reply:
    """A whole HTTP answer: status, headers and the body (already read, at most the call's cap)."""

    status: int
    headers: Mapping[str, str]
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", errors="replace")


class Cancelled(Exception):
    """should_cancel() turned true during a call (a read or a wait between tries)."""


class BodySink(Protocol):
    """Where an accepted answer's body goes instead of into the Reply (each try starts again)."""

    def begin(self, status: int, headers: Mapping[str, str], size: Optional[int]) -> int:
        """The answer's status line and headers are in (size: its Content-Length); returns the
        file offset of the body's first byte, or raises to refuse the answer."""

    def fill(self, offset: int, chunk: bytes) -> None:
        """The next chunk of the body, at this file offset."""

    def done(self, length: int) -> None:
        """The body ended after `length` bytes (checked against a Content-Length)."""


def sleep_checking(seconds: float, should_cancel: Optional[Callable[[], bool]],
                   sleep: Callable[[float], None] = time.sleep) -> None:
    """Sleep `seconds` in <= 0.25 s slices, raising Cancelled as soon as should_cancel() is true."""
    left = float(seconds)
    while True:
        if should_cancel is not None and should_cancel():
            raise Cancelled()
        if left <= 0:
            return
        step = min(CANCEL_CHECK_S, left)
        sleep(step)
        left -= step


class _DeadlinePassed(Exception):
    """Internal: a try ran past a deadline. stage: "first_byte" | "body"."""

    def __init__(self, stage: str, seconds: float) -> None:
        super().__init__(stage)
        self.stage, self.seconds = stage, seconds


class _TooLarge(Exception):
    """Internal: the answer is bigger than the call's cap (announced or while reading)."""

    def __init__(self, limit: int, size: int, announced: bool) -> None:
        super().__init__(size)
        self.limit, self.size, self.announced = limit, size, announced


# ----------------------------------------------------------------------------- transport

def _is_2xx(status: int) -> bool:
    return 200 <= status < 300


ENV_PROXY_VARS = ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY")   # read by requests by default; never by us
CA_BUNDLE_VARS = ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE")


def env_proxy_note(environ: Mapping[str, str]) -> str:
    """For an unreachable remote server: the proxy variables set in the environment, which the
    launcher does not use, and the setting that does ("" when none is set)."""
    found = [name for name in ENV_PROXY_VARS for var in (name, name.lower()) if environ.get(var)]
    if not found:
        return ""
    return (f"; the environment sets {found[0]}, which the launcher never uses (it reads neither proxy variables "
            "nor ~/.netrc): if this server is reached through a proxy, set remote_proxy in the launcher config "
            f"({env_var('remote_proxy')})")


class Transport:
    """One server's session: retries, deadlines and cancel for every call. Holds the key; never shows it.

    proxy: the local config's `remote_proxy` (an http(s):// URL), used unless the server is on
    loopback; nothing is ever taken from the environment (see the module docstring). supervised:
    this launcher started the server (a refused connection is then explained as such, not as a
    server the user must start)."""

    def __init__(self, base_url: str, api_key: Optional[str] = None, *, deadlines: Deadlines = Deadlines(),
                 retry: RetryPolicy = RetryPolicy(), proxy: Optional[str] = None,
                 sleep: Callable[[float], None] = time.sleep, supervised: bool = False) -> None:
        self.base_url = base_url.rstrip("/")
        self.supervised = supervised
        self._key = api_key or None
        self.deadlines = deadlines
        self.retry = retry
        self.sleep = sleep
        self.session = requests.Session()
        adapter = AbortableAdapter()
        self.session.mount("http://", adapter)
        self.session.mount("https://", adapter)
        self.session.trust_env = False        # no ~/.netrc, no proxy variables: see the module docstring
        loopback = is_loopback_url(self.base_url)
        self.proxy = proxy if proxy and not loopback else None
        if self.proxy:
            self.session.proxies = {"http": self.proxy, "https": self.proxy}
        bundle = next((os.environ[v] for v in CA_BUNDLE_VARS if os.environ.get(v)), None)
        if bundle:
            self.session.verify = bundle
        self._unreachable_note = "" if loopback or self.proxy else env_proxy_note(os.environ)
        self.session.headers["Accept-Encoding"] = "identity"   # never inflate a body we did not size
        if self._key:
            self.session.headers["Authorization"] = f"Bearer {self._key}"

    @property
    def has_key(self) -> bool:
        return self._key is not None

    def redact(self, text: str) -> str:
        return redact(text, self._key)

    def close(self) -> None:
        self.session.close()

    def __enter__(self) -> "Transport":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Transport({self.base_url!r}, api_key={'set' if self._key else None})"

    def request(self, method: str, path: str, *, what: str, idempotent: bool = True,
                ok: Callable[[int], bool] = _is_2xx, retry_statuses: frozenset[int] = RETRY_STATUSES,
                retry: Optional[RetryPolicy] = None, deadlines: Optional[Deadlines] = None,
                max_body: int = SMALL_BODY_LIMIT, large_body: bool = False, cap_reason: str = "",
                job_id: Optional[str] = None, should_cancel: Optional[Callable[[], bool]] = None,
                files: Optional[dict[str, Any]] = None, headers: Optional[Mapping[str, str]] = None,
                sink: Optional[BodySink] = None) -> Reply:
        """One call under the retry policy; returns the Reply whose status `ok` accepts.

        `large_body`: the body is a download bounded by deadlines.body_s (else it shares the
        first-byte deadline). `max_body`: cap on an accepted answer's body (`cap_reason` says
        why in the error). `headers`: extra request headers (e.g. Range). `sink`: an accepted
        answer's body goes there as it arrives (the Reply's body is then empty). Raises
        LauncherError (mapped), or Cancelled when should_cancel() turns true during a read or a
        wait; an exception the sink raises ends the call as it is.
        """
        url = self.base_url + path
        policy = retry or self.retry
        delays = policy.delays()
        limits = deadlines or self.deadlines
        attempt = 0
        while True:
            attempt += 1
            last = attempt > len(delays)
            try:
                reply = self._try(method, url, limits, ok=ok, max_body=max_body, large_body=large_body,
                                  should_cancel=should_cancel, files=files, headers=headers, sink=sink)
            except requests.exceptions.RequestException as exc:
                if last or not (idempotent or not_sent(exc)) or isinstance(exc, requests.exceptions.InvalidURL):
                    raise unreachable_error(self.base_url, exc, self._key, tries=attempt,
                                            note=self._unreachable_note, supervised=self.supervised) from None
                wait = delays[attempt - 1]
                log.debug("%s %s: %s; retry %d in %.2fs", method, path, type(exc).__name__, attempt, wait)
            except _DeadlinePassed as exc:
                if last or not idempotent or exc.stage == "body":
                    raise deadline_error(self.base_url, what, exc.stage, exc.seconds, tries=attempt) from None
                wait = delays[attempt - 1]
                log.debug("%s %s: %s deadline; retry %d in %.2fs", method, path, exc.stage, attempt, wait)
            except _TooLarge as exc:
                raise too_large_error(self.base_url, what, limit=exc.limit, size=exc.size, announced=exc.announced,
                                      cap_reason=cap_reason) from None
            else:
                if ok(reply.status):
                    return reply
                if reply.status not in retry_statuses or not idempotent or last:
                    raise http_error(reply.status, self.redact(reply.text), what=what, base_url=self.base_url,
                                     sent_key=self.has_key, job_id=job_id)
                wait = delays[attempt - 1]
                after = _retry_after(reply)
                if after is not None:
                    wait = min(max(wait, after), policy.max_s * 4)
                log.debug("%s %s: HTTP %d; retry %d in %.2fs", method, path, reply.status, attempt, wait)
            sleep_checking(wait, should_cancel, self.sleep)

    # -- one try -----------------------------------------------------------------------------

    def _try(self, method: str, url: str, limits: Deadlines, *, ok: Callable[[int], bool], max_body: int,
             large_body: bool, should_cancel: Optional[Callable[[], bool]],
             files: Optional[dict[str, Any]], headers: Optional[Mapping[str, str]],
             sink: Optional[BodySink]) -> Reply:
        """One exchange on a worker thread, stopped on cancel or when a deadline passes."""

        def stop_reason(att: Attempt[Reply]) -> Optional[BaseException]:
            if should_cancel is not None and should_cancel():
                return Cancelled()
            now = time.monotonic()
            if att.headers_at is None or not large_body:
                answer_by = (att.connected_at or att.started + limits.connect_s) + limits.first_byte_s
                return _DeadlinePassed("first_byte", limits.first_byte_s) if now > answer_by else None
            return _DeadlinePassed("body", limits.body_s) if now > att.headers_at + limits.body_s else None

        return run_try(lambda att: self._exchange(att, method, url, limits, ok, max_body, files, headers, sink),
                       stop_reason)

    def _exchange(self, att: Attempt[Reply], method: str, url: str, limits: Deadlines, ok: Callable[[int], bool],
                  max_body: int, files: Optional[dict[str, Any]], headers: Optional[Mapping[str, str]],
                  sink: Optional[BodySink]) -> Reply:
        """Worker thread: send, read the headers, then the body up to its cap."""
        resp = self.session.request(method, url, files=files, headers=headers, stream=True, allow_redirects=False,
                                    timeout=(limits.connect_s, limits.first_byte_s))
        att.headers_at = time.monotonic()
        try:
            wanted = ok(resp.status_code)
            limit = max_body if wanted else ERROR_BODY_LIMIT
            announced = _content_length(resp.headers)
            if wanted and announced is not None and announced > limit:
                raise _TooLarge(limit, announced, announced=True)
            if wanted and sink is not None:
                length = _read_into(resp.raw, sink, sink.begin(resp.status_code, resp.headers, announced), limit)
                if announced is not None and length != announced:
                    raise requests.exceptions.ConnectionError(
                        f"the answer ended after {length} of the {announced} bytes it announced")
                sink.done(length)
                return Reply(resp.status_code, resp.headers, b"")
            body = _read_capped(resp.raw, limit, strict=wanted)
            if wanted and announced is not None and len(body) != announced:
                raise requests.exceptions.ConnectionError(
                    f"the answer ended after {len(body)} of the {announced} bytes it announced")
            return Reply(resp.status_code, resp.headers, body)
        finally:
            resp.close()


def _content_length(headers: Mapping[str, str]) -> Optional[int]:
    try:
        value = int(headers.get("Content-Length", ""))
    except ValueError:
        return None
    return value if value >= 0 else None


def _read_chunk(raw: Any, most: int, chunk: int = CHUNK) -> bytes:
    """Up to `most` raw bytes of the body (b"" at its end), with urllib3's errors as requests'."""
    try:
        return raw.read(min(chunk, most), decode_content=False)
    except urllib3.exceptions.ReadTimeoutError as exc:
        raise requests.exceptions.ReadTimeout(exc) from exc
    except (urllib3.exceptions.HTTPError, http.client.HTTPException, OSError) as exc:
        raise requests.exceptions.ConnectionError(exc) from exc


def _read_into(raw: Any, sink: BodySink, offset: int, limit: int) -> int:
    """The raw body into `sink` from file offset `offset`; its length (never over `limit`)."""
    size = 0
    while True:
        chunk = _read_chunk(raw, limit + 1 - size, SINK_CHUNK)
        if not chunk:
            return size
        if size + len(chunk) > limit:
            raise _TooLarge(limit, size + len(chunk), announced=False)
        sink.fill(offset + size, chunk)
        size += len(chunk)


def _read_capped(raw: Any, limit: int, *, strict: bool) -> bytes:
    """The raw body, never holding more than limit + 1 bytes. Over the limit: _TooLarge when
    strict, else cut at the limit (an error answer only feeds a message)."""
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk = _read_chunk(raw, limit + 1 - size)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        size += len(chunk)
        if size > limit:
            if strict:
                raise _TooLarge(limit, size, announced=False)
            return b"".join(chunks)[:limit]


def _retry_after(reply: Reply) -> Optional[float]:
    value = reply.headers.get("Retry-After")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None
