"""The exchange with a vLLM-Omni server itself failed, as LauncherError text naming the setting to change:
refused, DNS, reset or cut (unreachable_error), past a deadline (deadline_error), or an answer over the
call's cap (too_large_error); and whether a failed request certainly never reached the server (not_sent,
so a POST may be repeated). Errors in the server's own answers are http_errors.py's.

Exception text can carry the URL and so the key: it is scrubbed (`redact`) and stripped of control
characters (`untrusted_text`) before it reaches an error's text.
"""
from __future__ import annotations

from typing import Any, Iterable, Optional
from urllib.parse import urlsplit

import requests

from ..errors import LauncherError
from ..errors.config_names import CONFIG_FILE_NAME, env_var
from ..errors.redact import untrusted_text


def redact(text: str, secret: Optional[str]) -> str:
    """`text` with the API key replaced by ***."""
    if secret and text:
        return text.replace(secret, "***")
    return text

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


def start_remote_hint(base_url: str) -> str:
    """How to start the server a remote URL names on its own machine (no node here starts it): `serve`'s
    options (cli/serve_cmd.py, cli/launch_options.py; a test parses it), on the URL's port."""
    try:
        parts = urlsplit(base_url)
        port = str(parts.port or (443 if parts.scheme == "https" else 80))
    except ValueError:
        port = "PORT"
    return (f"start it on the GPU machine (`python -m vllm_omni_launcher serve --model MODEL --host 0.0.0.0 "
            f"--port {port}`, which prints when it is ready), and check Remote Server's url (or the "
            "remote_server it names in the launcher config) for that machine's address and port")


def unreachable_error(base_url: str, exc: BaseException, secret: Optional[str] = None,
                      *, tries: int = 1, note: str = "", supervised: bool = False) -> LauncherError:
    """Connection-level failure as UI text (refused, DNS, timeout, reset); `note` is added to the fix (the
    transport's word on proxy variables it does not use). `supervised`: this launcher started the server, so
    refused means not ready yet or gone; otherwise it is remote, and only its own machine starts it."""
    raw = untrusted_text(redact(f"{type(exc).__name__}: {exc}", secret))
    after = f" (after {tries} tries)" if tries > 1 else ""
    if refused(exc):
        fix = ("the launcher started this server: wait until it reports ready (Server Status, or `serve` / "
               "`generate`'s output), or read why it exited in its log, which Server Status names; the launcher "
               "restarts a crashed server by itself, so queue the prompt again" if supervised
               else start_remote_hint(base_url))
        return LauncherError(
            f"Cannot reach the vLLM-Omni server at {base_url}{after}",
            "the connection was refused: nothing is listening there. The server is not running, "
            "has exited, is still loading the model (vLLM-Omni opens its port only once the weights "
            "are loaded and warm), or the URL/port is wrong",
            fix + note, setting="server", raw=raw, kind="refused")
    if isinstance(exc, requests.exceptions.Timeout):
        return LauncherError(
            f"The vLLM-Omni server at {base_url} did not answer in time{after}",
            "the connection or the response timed out; the host may be overloaded, asleep or behind "
            "a firewall, or the server is wedged",
            "check that the server is up (GET /health) and that the machine is reachable" + note,
            setting="server", raw=raw, kind="timeout")
    return LauncherError(
        f"Lost the connection to the vLLM-Omni server at {base_url}{after}",
        "the network connection failed or was closed before an answer came back "
        "(server crashed or restarted, or a network problem)",
        "check the server log and that it is still running, then queue the prompt again" + note,
        setting="server", raw=raw, kind="lost")


def deadline_error(base_url: str, what: str, stage: str, seconds: float, *, tries: int = 1) -> LauncherError:
    """A try that ran past a deadline, naming the local config key that sets it."""
    after = f" (after {tries} tries)" if tries > 1 else ""
    if stage == "body":
        key = "body_timeout_s"
        head = f"{what}: the download from {base_url} did not finish within {seconds:g} s{after}"
        why = ("the server kept the answer open (or sent it a few bytes at a time) past the whole-body "
               "deadline; it is overloaded, the network is very slow, or it is not a vLLM-Omni server")
    else:
        key = "first_byte_timeout_s"
        head = f"{what}: the server at {base_url} sent no complete answer within {seconds:g} s{after}"
        why = ("its answer had not arrived, or was trickling in a few bytes at a time, when the deadline "
               "passed; the server is overloaded or wedged, or it is not a vLLM-Omni server")
    return LauncherError(
        head, why,
        f"check the server (GET /health and its log); if it is only slow, raise {key} in the launcher's "
        f"local config ({CONFIG_FILE_NAME} or {env_var(key)})",
        setting=key, kind="timeout")


def too_large_error(base_url: str, what: str, *, limit: int, size: int, announced: bool,
                    cap_reason: str) -> LauncherError:
    """An answer over the call's cap: `announced` by its Content-Length, or seen while reading."""
    got = f"announced {_mb(size)}" if announced else f"sent more than {_mb(limit)}"
    return LauncherError(
        f"{what}: the server at {base_url} {got}, over the launcher's cap of {_mb(limit)}",
        (cap_reason or "no vLLM-Omni answer to this call is that large")
        + ("; the launcher refused it before reading" if announced else "; the launcher stopped reading at the cap")
        + ", so the server is misbehaving or is not vLLM-Omni",
        f"check which program answers at {base_url} and its log", setting="server")


def _mb(size: int) -> str:
    return f"{size / (1 << 20):.1f} MiB"
