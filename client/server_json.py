"""A server's JSON answer, parsed within bounds: at most MAX_JSON_CHARS, nested at most MAX_JSON_DEPTH.

Python's json parser recurses once per nesting level, so an answer of a million `[` (1 MiB, within
the transport's cap on a JSON body) raised a raw RecursionError from deep inside the client, and a
huge answer costs memory far beyond its text. vLLM-Omni's answers (a job, a model list, an error)
are a few KB, nested four levels at most. So every server answer is parsed here (http_errors.py's
parse_body is the one caller), and one outside the bounds is refused with the launcher's message
before json sees it. The depth is measured only when the text holds more brackets than the bound
(a job's few brackets cost one str.count each): strings dropped by one regex pass, then numpy.
"""
from __future__ import annotations

import json
import re
from typing import Any

import numpy as np

from ..errors import LauncherError

MAX_JSON_CHARS = 1 << 20        # the transport's cap on a JSON answer's body (SMALL_BODY_LIMIT): nothing real is near
MAX_JSON_DEPTH = 64             # vLLM-Omni nests 4 levels at most
_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"')
_OPEN, _CLOSE = np.frombuffer(b"[{", np.uint8), np.frombuffer(b"]}", np.uint8)


def parse_server_json(text: str) -> Any:
    """`json.loads(text)` for a server's answer: ValueError as json's for text that is not JSON,
    LauncherError for an answer longer than MAX_JSON_CHARS or nested deeper than MAX_JSON_DEPTH."""
    if len(text) > MAX_JSON_CHARS:
        raise _refused(f"it is {len(text)} characters long (at most {MAX_JSON_CHARS} are read)")
    if text.count("[") + text.count("{") > MAX_JSON_DEPTH:
        depth = _depth(text)
        if depth > MAX_JSON_DEPTH:
            raise _refused(f"it is nested {depth} levels deep (at most {MAX_JSON_DEPTH} are read)")
    return json.loads(text)


def _depth(text: str) -> int:
    """The deepest nesting of brackets outside strings: strings dropped by one regex pass, then a running
    sum over the rest in numpy (no Python step per character)."""
    rest = np.frombuffer(_STRINGS.sub("", text).encode("utf-8", "replace"), dtype=np.uint8)
    steps = np.isin(rest, _OPEN).astype(np.int32) - np.isin(rest, _CLOSE)
    return int(np.cumsum(steps).max(initial=0))


def _refused(why: str) -> LauncherError:
    return LauncherError(
        "The server's answer is not one the launcher reads",
        f"{why}; vLLM-Omni's answers are a few KB nested a few levels, so the server is misbehaving or is not "
        "vLLM-Omni, and the launcher did not parse it",
        "check which program answers at the server URL and its log", setting="server")


__all__ = ["MAX_JSON_CHARS", "MAX_JSON_DEPTH", "parse_server_json"]
