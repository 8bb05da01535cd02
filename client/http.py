"""HTTP plumbing for the vLLM-Omni client: one session, bounded retries, errors as UI text.

Policy (modelled on ComfyUI's own API nodes, comfyui-nodes.md section 3.3):

* Connection errors and HTTP 408/429/502/503/504 are retried with exponential backoff
  (`RetryPolicy`: 5 tries, 0.5 s doubling, capped at 4 s). Other 4xx are never retried.
* A request that must not run twice (job submit) is retried only when the connection
  failed before anything was sent (refused, unresolvable, connect timeout).
* Waits between tries are cut into <= 0.25 s slices that check `should_cancel`.
* Every failure becomes a `LauncherError` with the upstream body kept in `raw`, and the
  API key is scrubbed from anything we put into an error or a log line.

Upstream error shapes (vllm-omni-serving.md section 4.2/4.3, checked against the 0.30 wheel):
`{"error": {"message", "type", "param": "body.<field>" | null, "code"}}` for 4xx/5xx,
`{"error": "Unauthorized"}` for a missing/wrong key, and a failed job's own body
(`{"id", "status": "failed", "error": {"code", "message"}, ...}`) with HTTP 500.
"""
from __future__ import annotations

import json
import logging
import re
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional

import requests

from ..errors import LauncherError

log = logging.getLogger(__name__)

RETRY_STATUSES = frozenset({408, 429, 502, 503, 504})
KEY_ENV = "VLLM_OMNI_LAUNCHER_REMOTE_API_KEY"
CANCEL_CHECK_S = 0.25

# Form field (upstream) -> setting name the user sees (node widget).
FIELD_SETTINGS: dict[str, str] = {
    "prompt": "prompt",
    "negative_prompt": "negative_prompt",
    "width": "width",
    "height": "height",
    "size": "width/height",
    "num_frames": "frames",
    "seconds": "seconds",
    "fps": "fps",
    "num_inference_steps": "steps",
    "guidance_scale": "guidance",
    "guidance_scale_2": "guidance_2",
    "boundary_ratio": "boundary_ratio",
    "flow_shift": "flow_shift",
    "seed": "seed",
    "input_reference": "image",
    "image_reference": "image",
    "extra_params": "extra_params",
    "model": "model",
}

# Valid ranges upstream enforces (protocol/videos.py), to say what to set instead.
FIELD_LIMITS: dict[str, str] = {
    "num_inference_steps": "1..200",
    "guidance_scale": "0..20",
    "guidance_scale_2": "0..20",
    "boundary_ratio": "0..1",
    "fps": ">= 1",
    "num_frames": ">= 1, and 4k+1 for Wan (e.g. 81)",
    "width": "a positive multiple of 16 (32 for TI2V-5B)",
    "height": "a positive multiple of 16 (32 for TI2V-5B)",
    "seconds": "a whole number (e.g. 4); the launcher itself sends frames instead",
}


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


class Cancelled(Exception):
    """Internal: should_cancel() turned true while waiting between tries."""


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


def redact(text: str, secret: Optional[str]) -> str:
    if secret and text:
        return text.replace(secret, "***")
    return text


# ----------------------------------------------------------------------------- connection errors

def _exception_chain(exc: BaseException) -> Iterable[BaseException]:
    seen: set[int] = set()
    stack: list[Any] = [exc]
    while stack:
        item = stack.pop()
        if not isinstance(item, BaseException) or id(item) in seen:
            continue
        seen.add(id(item))
        yield item
        stack.extend([item.__cause__, item.__context__, getattr(item, "reason", None)])
        stack.extend(a for a in getattr(item, "args", ()) if isinstance(a, BaseException))


def not_sent(exc: BaseException) -> bool:
    """True when the request certainly never reached the server (safe to repeat a POST)."""
    from urllib3.exceptions import ConnectTimeoutError, NewConnectionError  # noqa: PLC0415

    if isinstance(exc, requests.exceptions.ConnectTimeout):
        return True
    return any(isinstance(e, (NewConnectionError, ConnectTimeoutError, ConnectionRefusedError))
               for e in _exception_chain(exc))


def refused(exc: BaseException) -> bool:
    return any(isinstance(e, ConnectionRefusedError) or "Connection refused" in str(e)
               for e in _exception_chain(exc))


def unreachable_error(base_url: str, exc: BaseException, secret: Optional[str] = None,
                      *, tries: int = 1) -> LauncherError:
    """Connection-level failure as UI text (refused, DNS, timeout, reset)."""
    raw = redact(f"{type(exc).__name__}: {exc}", secret)
    after = f" (after {tries} tries)" if tries > 1 else ""
    if refused(exc):
        err = LauncherError(
            f"Cannot reach the vLLM-Omni server at {base_url}{after}",
            "the connection was refused: nothing is listening there. The server is not running, "
            "has exited, is still loading the model (vLLM-Omni opens its port only once the weights "
            "are loaded and warm), or the URL/port is wrong",
            "start the server with the launcher node (or wait until it reports ready), and check the URL",
            setting="server",
            raw=raw,
        )
        err.kind = "refused"
    elif isinstance(exc, requests.exceptions.Timeout):
        err = LauncherError(
            f"The vLLM-Omni server at {base_url} did not answer in time{after}",
            "the connection or the response timed out; the host may be overloaded, asleep or behind "
            "a firewall, or the server is wedged",
            "check that the server is up (GET /health) and that the machine is reachable",
            setting="server",
            raw=raw,
        )
        err.kind = "timeout"
    else:
        err = LauncherError(
            f"Lost the connection to the vLLM-Omni server at {base_url}{after}",
            "the network connection failed or was closed before an answer came back "
            "(server crashed or restarted, or a network problem)",
            "check the server log and that it is still running, then queue the prompt again",
            setting="server",
            raw=raw,
        )
        err.kind = "lost"
    return err


# ----------------------------------------------------------------------------- HTTP errors

def parse_body(text: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, TypeError):
        return None


def error_message(body: Any, text: str) -> str:
    """The human message inside any upstream error shape, else the raw text."""
    if isinstance(body, dict):
        err = body.get("error", body.get("detail"))
        if isinstance(err, dict):
            msg = err.get("message") or err.get("msg")
            if msg:
                return str(msg)
        elif isinstance(err, str) and err:
            return err
        elif isinstance(err, list) and err:
            return "; ".join(str(e.get("msg", e)) if isinstance(e, dict) else str(e) for e in err)
        if body.get("message"):
            return str(body["message"])
    return (text or "").strip()


def error_field(body: Any, message: str) -> Optional[str]:
    """The form field an upstream 400/422 is about: `param: body.<field>`, else the message."""
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        param = body["error"].get("param")
        if isinstance(param, str) and param:
            return param.split(".")[-1] if param.startswith("body.") or "." in param else param
    # pydantic text: "1 validation error for VideoGenerationRequest\nnum_inference_steps\n  Input ..."
    for line in message.splitlines():
        name = line.strip()
        if name in FIELD_SETTINGS:
            return name
    for name in sorted(FIELD_SETTINGS, key=len, reverse=True):
        if re.search(rf"(?<![\w.]){re.escape(name)}(?![\w])", message):
            return name
    return None


def is_oom(message: str) -> bool:
    text = message.lower()
    return ("out of memory" in text or "outofmemoryerror" in text or "cuda oom" in text
            or "cudaerrormemoryallocation" in text)


OOM_FIX = ("lower width/height or frames, enable VAE tiling, CPU offload or a parallel mode "
           "(--usp 2 / --cfg-parallel-size 2 on two GPUs), or set the serving config to auto so the "
           "launcher picks settings that fit")


def job_failed_error(job_id: str, message: str, raw: str, code: Any = None) -> LauncherError:
    """A job the server marked failed, with the OOM case explained."""
    if is_oom(message):
        return LauncherError(
            f"The GPU ran out of memory while generating job {job_id}",
            "the request's resolution x frames needs more GPU memory than the current serving "
            "configuration has free (activations grow with width x height x frames)",
            OOM_FIX,
            setting="width",
            raw=raw,
        )
    if "no image is provided" in message.lower():
        return LauncherError(
            f"Job {job_id} failed: the model needs a start image",
            "the loaded model is image-to-video (I2V-A14B) and the request carried no image",
            "connect an IMAGE to the 'image' input, or load T2V-A14B / TI2V-5B",
            setting="image", raw=raw)
    if "divisible by" in message.lower() and ("height" in message.lower() or "width" in message.lower()):
        return LauncherError(
            f"Job {job_id} failed: width/height not accepted by the model",
            message,
            "set width and height to multiples of 16 (32 for TI2V-5B)",
            setting="width", raw=raw)
    if "enginedead" in message.replace(" ", "").lower() or "engine core" in message.lower():
        return LauncherError(
            f"Job {job_id} failed because the vLLM-Omni engine died",
            "the GPU worker process crashed (see the server log); the server shuts down after this",
            "let the launcher restart the server (re-run the prompt), and check the server log for the cause",
            setting="server", raw=raw)
    return LauncherError(
        f"The server failed job {job_id}: {_first_line(message) or 'no error message'}",
        "the generation raised an error on the server" + (f" (code {code})" if code not in (None, 500) else ""),
        "check the settings named in the message and the server log; then queue the prompt again",
        raw=raw,
    )


def validation_reason(message: str) -> str:
    """The useful sentence of an upstream validation message (pydantic or FastAPI form)."""
    found = re.search(r"""'msg': (?:"((?:[^"\\]|\\.)*)"|'((?:[^'\\]|\\.)*)')""", message)
    if found:
        return (found.group(1) or found.group(2) or "").replace("\\\\", "\\")
    found = re.search(r"Input should [^\[\n]+", message)
    if found:
        return found.group(0).strip().rstrip(",")
    return _first_line(message)


def _first_line(text: str, limit: int = 200) -> str:
    line = (text or "").strip().splitlines()[0] if (text or "").strip() else ""
    return line if len(line) <= limit else line[: limit - 1] + "…"


def http_error(status: int, text: str, *, what: str, base_url: str, sent_key: bool,
               job_id: Optional[str] = None, secret: Optional[str] = None) -> LauncherError:
    """An HTTP error answer from the server as UI text. `what` names the operation."""
    text = redact(text or "", secret)
    body = parse_body(text)
    message = error_message(body, text)
    raw = f"HTTP {status}: {text.strip()}" if text.strip() else f"HTTP {status}"

    if isinstance(body, dict) and body.get("status") == "failed" and body.get("id"):
        err = body.get("error") or {}
        return job_failed_error(str(body["id"]), error_message({"error": err}, ""), raw,
                                err.get("code") if isinstance(err, dict) else None)

    if status == 401:
        if sent_key:
            return LauncherError(
                f"The vLLM-Omni server at {base_url} rejected the API key",
                "it was started with --api-key (VLLM_API_KEY) and the key the launcher sent does not match",
                "set the right key for this URL in the launcher's local config (remote_api_keys in "
                f"vllm_omni_launcher.json) or in {KEY_ENV}; keys never come from workflow widgets",
                setting=KEY_ENV, raw=raw)
        return LauncherError(
            f"The vLLM-Omni server at {base_url} requires an API key",
            "it was started with --api-key (VLLM_API_KEY), so /v1/* needs 'Authorization: Bearer <key>', "
            "and no key is configured for this URL",
            "put the key in the launcher's local config (remote_api_keys in vllm_omni_launcher.json) or in "
            f"{KEY_ENV}; keys never come from workflow widgets",
            setting=KEY_ENV, raw=raw)

    if status in (400, 422):
        if status == 422 and job_id and "generation failed" in message.lower():
            return LauncherError(
                f"Job {job_id} failed, so there is no video to download",
                "the server marked the job failed", "check the job's error and the server log", raw=raw)
        if message.lower().startswith("model mismatch"):
            return LauncherError(
                f"{what} was refused: the server runs a different model",
                message,
                "use the server handle from the loader node that started this model", setting="model", raw=raw)
        field = error_field(body, message)
        setting = FIELD_SETTINGS.get(field or "", field or "")
        limit = FIELD_LIMITS.get(field or "")
        if field:
            return LauncherError(
                f"The server refused the value of '{setting}'",
                f"vLLM-Omni rejected form field '{field}': {validation_reason(message)}",
                f"set {setting} to {limit}" if limit else f"change {setting} and queue the prompt again",
                setting=setting, raw=raw)
        return LauncherError(
            f"{what} was refused as a bad request",
            _first_line(message) or f"HTTP {status}",
            "check the node's settings against the message and queue the prompt again", raw=raw)

    if status == 404:
        if job_id:
            return LauncherError(
                f"The server no longer knows job {job_id}",
                "jobs live in the server's memory only: it was deleted, or the server restarted "
                "(for example after a crash or an idle stop) and forgot it",
                "queue the prompt again", setting="server", raw=raw)
        if "model" in message.lower():
            return LauncherError(
                f"{what}: the server does not serve the requested model",
                _first_line(message), "use the loader node's server handle for this model",
                setting="model", raw=raw)
        return LauncherError(
            f"{what}: the server at {base_url} has no such endpoint",
            "it answered 404, so it is not a vLLM-Omni server with the /v1/videos API "
            "(plain vLLM without --omni, a non-video model, or another program on that port)",
            "point the URL at a vLLM-Omni server started with `vllm serve <Wan2.2 model> --omni`",
            setting="server", raw=raw)

    if status == 409:
        if "api-server-count" in message.lower() or "single api" in message.lower() or "api server" in message.lower():
            return LauncherError(
                f"{what} was refused: the server runs several API processes",
                "vLLM-Omni keeps video jobs in one process's memory and refuses /v1/videos with --api-server-count > 1",
                "start the server with --api-server-count 1 (the launcher's default)", setting="server", raw=raw)
        return LauncherError(
            f"{what} was refused by the server (conflict)",
            _first_line(message) or "the job is in a state that does not allow this yet",
            "wait a moment and queue the prompt again", raw=raw)

    if status in RETRY_STATUSES:
        return LauncherError(
            f"{what}: the server at {base_url} kept answering HTTP {status}",
            "it is overloaded, still starting, or a proxy in front of it cannot reach it "
            f"({_first_line(message) or 'no message'})",
            "wait until the server is healthy (the loader node reports it), then queue the prompt again",
            setting="server", raw=raw)

    if status >= 500:
        if is_oom(message):
            return job_failed_error(job_id or "?", message, raw)
        return LauncherError(
            f"{what}: the server hit an internal error (HTTP {status})",
            _first_line(message) or "no message",
            "check the server log; if it repeats, restart the server from the launcher", raw=raw)

    return LauncherError(
        f"{what}: unexpected HTTP {status} from {base_url}",
        _first_line(message) or "no message", "check the server log", raw=raw)


# ----------------------------------------------------------------------------- transport

class Transport:
    """requests.Session + retries. Holds the key; never shows it."""

    def __init__(self, base_url: str, api_key: Optional[str], *, retry: RetryPolicy,
                 timeout: tuple[float, float], sleep: Callable[[float], None] = time.sleep) -> None:
        self.base_url = base_url.rstrip("/")
        self._key = api_key or None
        self.retry = retry
        self.timeout = timeout
        self.sleep = sleep
        self.session = requests.Session()
        # A loopback server must not go through HTTP(S)_PROXY from the environment
        # (requests only bypasses it when NO_PROXY lists the host); remote ones may need it.
        self.session.trust_env = not _is_loopback(self.base_url)
        if self._key:
            self.session.headers["Authorization"] = f"Bearer {self._key}"

    @property
    def has_key(self) -> bool:
        return self._key is not None

    def redact(self, text: str) -> str:
        return redact(text, self._key)

    def close(self) -> None:
        self.session.close()

    def __repr__(self) -> str:
        return f"Transport({self.base_url!r}, api_key={'set' if self._key else None})"

    def request(self, method: str, path: str, *, what: str, idempotent: bool = True,
                ok: Callable[[int], bool] = lambda s: 200 <= s < 300,
                job_id: Optional[str] = None, should_cancel: Optional[Callable[[], bool]] = None,
                timeout: Optional[tuple[float, float]] = None, stream: bool = False,
                retry: Optional[RetryPolicy] = None, **kwargs: Any) -> requests.Response:
        """One call with the retry policy. Returns a response whose status `ok` accepts.

        Raises LauncherError (mapped), or Cancelled when should_cancel() turns true between tries.
        """
        url = self.base_url + path
        policy = retry or self.retry
        delays = policy.delays()
        attempt = 0
        while True:
            attempt += 1
            try:
                resp = self.session.request(method, url, timeout=timeout or self.timeout, stream=stream, **kwargs)
            except requests.exceptions.RequestException as exc:
                retriable = not_sent(exc) or idempotent
                if not retriable or attempt > len(delays) or isinstance(exc, requests.exceptions.InvalidURL):
                    raise unreachable_error(self.base_url, exc, self._key, tries=attempt) from None
                log.debug("%s %s: %s; retry %d in %.2fs", method, path, type(exc).__name__, attempt,
                          delays[attempt - 1])
                sleep_checking(delays[attempt - 1], should_cancel, self.sleep)
                continue
            if ok(resp.status_code):
                return resp
            if resp.status_code in RETRY_STATUSES and idempotent and attempt <= len(delays):
                wait = delays[attempt - 1]
                after = _retry_after(resp)
                if after is not None:
                    wait = min(max(wait, after), policy.max_s * 4)
                resp.close()
                log.debug("%s %s: HTTP %d; retry %d in %.2fs", method, path, resp.status_code, attempt, wait)
                sleep_checking(wait, should_cancel, self.sleep)
                continue
            text = _read_text(resp)
            raise http_error(resp.status_code, text, what=what, base_url=self.base_url,
                             sent_key=self.has_key, job_id=job_id, secret=self._key)


def _is_loopback(url: str) -> bool:
    import ipaddress  # noqa: PLC0415
    from urllib.parse import urlsplit  # noqa: PLC0415

    host = (urlsplit(url).hostname or "").strip("[]").lower()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _retry_after(resp: requests.Response) -> Optional[float]:
    value = resp.headers.get("Retry-After")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None


def _read_text(resp: requests.Response, limit: int = 64 * 1024) -> str:
    try:
        data = resp.raw.read(limit, decode_content=True) if resp.raw is not None and not resp._content_consumed \
            else resp.content[:limit]
        if isinstance(data, bytes):
            return data.decode(resp.encoding or "utf-8", errors="replace")
        return str(data)
    except Exception:  # noqa: BLE001 - the body is only for the error text
        try:
            return resp.text[:limit]
        except Exception:  # noqa: BLE001
            return ""
    finally:
        resp.close()
