"""Typed settings from raw values: a config file's JSON values and environment variable text.

The local config declares each setting once as a dataclass field; this module turns a raw
value into that field's type (bool, int, float, str, Optional[...], a command as
tuple[str, ...], an environment as dict[str, str]), describes the type in words for error
messages and the reference table, and builds the errors that name the file or variable.
"""
from __future__ import annotations

import difflib
import json
import math
import shlex
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Optional, Union, get_args, get_origin

from ...errors import LauncherError


class NotConvertible(Exception):
    """A raw value that does not fit its setting's type."""


def optional_of(tp: Any) -> Any:
    """X for Optional[X], else None."""
    return next(a for a in get_args(tp) if a is not type(None)) if get_origin(tp) is Union else None


def expected(tp: Any) -> str:
    """What a value of type `tp` looks like, in words."""
    if optional_of(tp):
        return expected(optional_of(tp)) + " (or null)"
    return {bool: "true or false", int: "an integer", float: "a number", str: "a string"}.get(tp) or (
        "a command: a string or a list of strings" if get_origin(tp) is tuple else "an object of names to strings")


def convert(tp: Any, raw: Any, from_env: bool) -> Any:
    """`raw` (JSON value, or env text when `from_env`) as a value of type `tp`; raises NotConvertible."""
    if optional_of(tp):
        return None if raw is None else convert(optional_of(tp), raw, from_env)
    if from_env and tp in (int, float):
        try:
            raw = tp(raw.strip())
        except ValueError:
            raise NotConvertible from None
    if tp is bool:
        words = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False,
                 "off": False}
        if from_env and raw.strip().lower() in words:
            return words[raw.strip().lower()]
        if isinstance(raw, bool) and not from_env:
            return raw
    elif tp is int and isinstance(raw, int) and not isinstance(raw, bool):
        return raw
    elif tp is float and isinstance(raw, (int, float)) and not isinstance(raw, bool) and math.isfinite(raw):
        return float(raw)
    elif tp is str and isinstance(raw, str):
        return raw
    elif get_origin(tp) is tuple:
        try:
            parts = shlex.split(raw) if isinstance(raw, str) else raw
        except ValueError:
            raise NotConvertible from None
        if isinstance(parts, (list, tuple)) and all(isinstance(p, str) for p in parts):
            return tuple(parts)
    elif get_origin(tp) is dict and isinstance(raw, dict):
        if all(isinstance(v, (str, int, float)) and not isinstance(v, bool) for v in raw.values()):
            return {str(k): str(v) for k, v in raw.items()}
    raise NotConvertible


def shown(raw: Any) -> str:
    """A short description of a bad value (never whole: it may be long or secret-adjacent)."""
    if isinstance(raw, str):
        return "the string " + json.dumps(raw[:40] + ("..." if len(raw) > 40 else ""))
    if isinstance(raw, bool) or raw is None:
        return json.dumps(raw)
    if isinstance(raw, (int, float)):
        text = str(raw)                 # a workflow's integer may have thousands of digits
        return f"the number {text}" if len(text) <= 40 else f"a number of {len(text)} digits"
    return "a list" if isinstance(raw, list) else "an object"


def file_error(key: str, path: Optional[Path], why: str, fix: str) -> LauncherError:
    """A bad value for `key` in the config file at `path`."""
    return LauncherError(f"Setting '{key}' in the launcher config {path} is not valid", why, fix, setting=key,
                         kind="config")


def env_error(var: str, key: str, why: str, fix: str) -> LauncherError:
    """A bad value in the environment variable `var` (setting `key`)."""
    return LauncherError(f"Environment variable {var} is not valid", why, fix, setting=key, kind="config")


def type_word(tp: Any) -> str:
    """One word for a type, for the reference table."""
    if optional_of(tp):
        return type_word(optional_of(tp))
    if get_origin(tp) is tuple:
        return "command (string or list)"
    return {bool: "boolean", int: "integer", float: "number", str: "string"}.get(tp, "object")


def did_you_mean(key: str, known: Iterable[str]) -> str:
    """The fix prefix "did you mean 'x'? " for the known name closest to a misspelt `key`, or ""."""
    close = difflib.get_close_matches(key, list(known), n=1, cutoff=0.6)
    return f"did you mean '{close[0]}'? " if close else ""
