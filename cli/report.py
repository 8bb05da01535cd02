"""How the command line shows an error: what / why / fix as text on stderr, or JSON on stdout under --json.

Under --json, stdout holds exactly one JSON object whatever happens, so a script can always
parse it: the result, or {"error": {"what", "why", "fix", "setting", "kind", "raw"}}.
Server-provided text (raw) can hold terminal escapes; both forms strip them.
"""
from __future__ import annotations

import json
import sys

from ..errors import LauncherError
from ..errors.redact import strip_control

ERROR_FIELDS = ("what", "why", "fix", "setting", "kind", "raw")


def error_json(exc: LauncherError) -> dict[str, dict[str, str]]:
    """{"error": {...}}: the JSON form of a LauncherError."""
    return {"error": {name: strip_control(getattr(exc, name) or "") for name in ERROR_FIELDS}}


def report_error(exc: LauncherError, json_mode: bool) -> None:
    if json_mode:
        print(json.dumps(error_json(exc), indent=1), flush=True)
    else:
        print(f"error: {strip_control(str(exc))}", file=sys.stderr, flush=True)
