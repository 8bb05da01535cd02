"""The record of the last server Local Server started, for `prestart_last_server`.

The first clip after ComfyUI starts used to pay the whole launch (imports, weights, warm-up) when
the workflow was queued. So each time Local Server gets a ready server, the choices that made it
are written here; with the setting on, the node layer starts the same server when ComfyUI loads
the pack. The record is always written (it is small and holds no secret: model path or preset,
LoRA paths and strengths, the Serving Config widgets), so turning the setting on later works at
the next start.

This module stores and checks plain JSON only (the node layer turns it into its own choice
types): a file we did not write (a link, another owner, open to others), one too large, not
JSON, with NaN/inf or with wrong types is refused with the reason, so the caller can say it in
one line and start nothing.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from ..config.local_config import default_data_dir
from . import private_files

FILE_NAME = "last_local_server.json"
MAX_BYTES = 64 * 1024
VERSION = 1
SETTING = "prestart_last_server"
# top-level keys and their JSON types (bool is checked apart: it is an int in Python)
_FIELDS: dict[str, type] = {"model": dict, "serving": dict, "cfg": bool, "queued_jobs": int, "fingerprint": str}


class BadRecord(ValueError):
    """The record cannot be used; its message says why."""


def record_path(data_dir: str) -> Path:
    """Where the record lives: directly in the data dir (which may be the user's link)."""
    return Path(data_dir or default_data_dir()).expanduser() / FILE_NAME


def write(data_dir: str, record: dict[str, Any]) -> Path:
    """Replace the record atomically, 0600, never through a link (private_files' rules)."""
    folder = private_files.private_dir(data_dir or default_data_dir())
    target = folder / FILE_NAME
    payload = json.dumps({"version": VERSION, **record}, allow_nan=False, sort_keys=True).encode()
    if len(payload) > MAX_BYTES:
        raise BadRecord(f"the record would be {len(payload)} bytes, over {MAX_BYTES}")
    with private_files.replacing(target) as out:
        out.write(payload)
    return target


def read(data_dir: str) -> dict[str, Any]:
    """The checked record (without its version); raises FileNotFoundError when there is none and
    BadRecord for anything else that cannot be used."""
    path = record_path(data_dir)
    if not path.is_symlink() and not path.exists():
        raise FileNotFoundError(str(path))
    raw = private_files.read_private(path, MAX_BYTES + 1)
    if raw is None:
        raise BadRecord("it is a link, not a regular file, not yours or readable by others, so the launcher "
                        "did not write it")
    if len(raw) > MAX_BYTES:
        raise BadRecord(f"it is larger than {MAX_BYTES // 1024} KiB")
    return parse(raw)


def parse(raw: bytes) -> dict[str, Any]:
    """The record in `raw`, its top-level types checked and no number NaN or infinite."""
    try:
        data = json.loads(raw, parse_constant=_no_constant)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRecord(f"it is not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise BadRecord("it is not a JSON object")
    if data.get("version") != VERSION:
        raise BadRecord(f"its version is {data.get('version')!r}, this launcher writes {VERSION}")
    for key, kind in _FIELDS.items():
        value = data.get(key)
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise BadRecord(f"'{key}' is missing or not a {kind.__name__}")
    _finite(data)
    return {key: data[key] for key in _FIELDS}


def _no_constant(name: str) -> Any:
    raise BadRecord(f"it holds {name}, which is not a number")


def _finite(value: Any) -> None:
    if isinstance(value, float) and not math.isfinite(value):
        raise BadRecord("it holds a number that is not finite")
    if isinstance(value, dict):
        for item in value.values():
            _finite(item)
    elif isinstance(value, list):
        for item in value:
            _finite(item)
