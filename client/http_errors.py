"""Failures talking to a vLLM-Omni server, as LauncherError text naming the setting to change.

The server answered with an error (the exchange itself failing, refused, cut, past a deadline or
over its cap, is exchange_errors.py's). Upstream error shapes (checked against the 0.30 wheel's
FastAPI app and exception handlers):
`{"error": {"message", "type", "param": "body.<field>" | null, "code"}}` for 4xx/5xx,
`{"error": "Unauthorized"}` for a missing/wrong key, and a failed job's own body
(`{"id", "status": "failed", "error": {"code", "message"}, ...}`) with HTTP 500.

Everything a server sends is untrusted: terminal control characters, escape sequences and
invisible format characters (zero-width, bidi) are stripped and its length is capped
(`untrusted_text`) before any of it reaches an error's text, and callers scrub the API key from
it first (`exchange_errors.redact`).
"""
from __future__ import annotations

import re
from typing import Any, Optional

from ..errors import LauncherError
from ..errors.failure_patterns import (API_SERVER_COUNT, CONTENT_OF_FAILED_JOB, ENGINE_DEAD, MODEL_MISMATCH,
                                      MODEL_UNKNOWN, NO_IMAGE, SIZE_NOT_DIVISIBLE, is_oom)
from ..errors.redact import strip_control, untrusted_text
from .origins import key_setup_hint
from .request_fields import REQUEST_FIELDS
from .server_json import parse_server_json

# Statuses that mean "busy, starting or behind a failing proxy: ask again" (retried by the transport).
RETRY_STATUSES = frozenset({408, 429, 502, 503, 504})
KEY_SETTING = "remote_servers"
MESSAGE_LIMIT = 500            # characters of a server's message inside our what/why text
ID_LIMIT = 120                 # characters of a server-given job id or model name shown


# ----------------------------------------------------------------------------- HTTP error answers

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

# What to set a refused form field to: the launcher's range (request_fields.py: upstream's, or narrower)
# and what else the value must be.
FIELD_LIMITS: dict[str, str] = {
    **{f.form: f.range_text + (f", {f.rule}" if f.rule else "") for f in REQUEST_FIELDS.values()},
    "seconds": "a whole number (e.g. 4); the launcher itself sends frames instead",
}


def parse_body(text: str) -> Any:
    try:
        return parse_server_json(text)      # bounded size and depth (server_json.py)
    except (ValueError, TypeError):
        return None


def model_ids(body: Any) -> Optional[list[str]]:
    """Served model names in a GET /v1/models answer, or None when it is not a model list."""
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(data, list):
        return None
    return [untrusted_text(str(m["id"]), ID_LIMIT) for m in data if isinstance(m, dict) and m.get("id")]


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
            param = untrusted_text(param, ID_LIMIT)
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


# What frees GPU memory for a job, named as the user sets it: Serving Config's widgets (planner/launch_plan.py
# ServingChoice) and the CLI's options, which client/ may not import: tests/unit/test_job_failure_text.py checks them.
OOM_FIX = ("lower width/height or frames; or in Serving Config turn vae_tiling on, set offload to 'module', or "
           "use two GPUs with parallel_mode ulysses or cfg and parallel_degree 2 (CLI: --vae-tiling, --offload "
           "module, --parallel ulysses=2 or --parallel cfg=2); parallel_mode auto (CLI: --parallel auto) lets the "
           "launcher pick settings that fit")


def job_failed_error(job_id: str, message: str, raw: str, code: Any = None) -> LauncherError:
    """A job the server marked failed, with the OOM case explained. All three strings come from
    the server; they are shown without control characters."""
    job_id, raw = untrusted_text(job_id, ID_LIMIT), untrusted_text(raw)
    full = strip_control(message)                 # matched whole (at most an error body's cap) ...
    message = untrusted_text(full, MESSAGE_LIMIT)  # ... and shown capped
    if is_oom(full):
        return LauncherError(
            f"The GPU ran out of memory while generating job {job_id}",
            "the request's resolution x frames needs more GPU memory than the current serving "
            "configuration has free (activations grow with width x height x frames)",
            OOM_FIX,
            setting="width",
            raw=raw,
        )
    if NO_IMAGE.search(full):
        return LauncherError(
            f"Job {job_id} failed: the model needs a start image",
            "the loaded model is image-to-video (I2V-A14B) and the request carried no image",
            "connect an IMAGE to the 'image' input, or load T2V-A14B / TI2V-5B",
            setting="image", raw=raw)
    if SIZE_NOT_DIVISIBLE.search(full):
        return LauncherError(
            f"Job {job_id} failed: width/height not accepted by the model",
            message,
            "set width and height to multiples of 16 (32 for TI2V-5B)",
            setting="width", raw=raw)
    if ENGINE_DEAD.search(full):
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
        return untrusted_text((found.group(1) or found.group(2) or "").replace("\\\\", "\\"), MESSAGE_LIMIT)
    found = re.search(r"Input should [^\[\n]+", message)
    if found:
        return untrusted_text(found.group(0).strip().rstrip(","), MESSAGE_LIMIT)
    return _first_line(message)


def _first_line(text: str, limit: int = 200) -> str:
    line = (text or "").strip().splitlines()[0] if (text or "").strip() else ""
    return line if len(line) <= limit else line[: limit - 1] + "…"


def http_error(status: int, text: str, *, what: str, base_url: str, sent_key: bool,
               job_id: Optional[str] = None) -> LauncherError:
    """An HTTP error answer from the server (`text`: its body, the key already scrubbed) as UI
    text. `what` names the operation."""
    text = strip_control(text or "")
    job_id = untrusted_text(job_id, ID_LIMIT) if job_id else job_id
    body = parse_body(text)
    message = strip_control(error_message(body, text))   # JSON escapes (\u001b) decode to controls
    raw = untrusted_text(f"HTTP {status}: {text.strip()}" if text.strip() else f"HTTP {status}")

    if isinstance(body, dict) and body.get("status") == "failed" and body.get("id"):
        err = body.get("error") or {}
        return job_failed_error(str(body["id"]), error_message({"error": err}, ""), raw,
                                err.get("code") if isinstance(err, dict) else None)

    if status == 401:
        if sent_key:
            return LauncherError(
                f"The vLLM-Omni server at {base_url} rejected the API key",
                "it was started with --api-key (VLLM_API_KEY) and the key the launcher sent does not match",
                f"give this server its right key: {key_setup_hint(base_url)}",
                setting=KEY_SETTING, raw=raw)
        return LauncherError(
            f"The vLLM-Omni server at {base_url} requires an API key",
            "it was started with --api-key (VLLM_API_KEY), so /v1/* needs 'Authorization: Bearer <key>', "
            "and the launcher's local config names no key for this server's origin (keys are only sent "
            "to origins the operator configured)",
            key_setup_hint(base_url),
            setting=KEY_SETTING, raw=raw)

    if status in (400, 422):
        if status == 422 and job_id and CONTENT_OF_FAILED_JOB.search(message):
            return LauncherError(
                f"Job {job_id} failed, so there is no video to download",
                "the server marked the job failed", "check the job's error and the server log", raw=raw)
        if MODEL_MISMATCH.match(message):
            return LauncherError(
                f"{what} was refused: the server runs a different model",
                untrusted_text(message, MESSAGE_LIMIT),
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
        if MODEL_UNKNOWN.search(message):
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
        if API_SERVER_COUNT.search(message):
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
