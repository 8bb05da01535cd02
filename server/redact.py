"""Keep secrets and terminal tricks out of what people see: reprs, logs and node text.

Two kinds of text leave the launcher for a human: settings we print (a config repr, the
`argv` command's environment) and strings a server sent us (job ids, error bodies, log lines).
The first may hold an operator's tokens; the second is untrusted and may carry escape
sequences that rewrite a terminal or hide text in the UI. This module is the one place that
decides what counts as a secret name and which characters are stripped.
"""
from __future__ import annotations

import re
from collections.abc import Mapping

MASK = "***"

# Substrings of a variable name that mark its value as secret (HF_TOKEN, AWS_SECRET_ACCESS_KEY,
# VLLM_API_KEY, PGPASSWORD, GOOGLE_APPLICATION_CREDENTIALS...). Over-masking is harmless.
SECRET_NAME_PARTS = ("TOKEN", "KEY", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL")

# user:password@ inside a URL value (HTTPS_PROXY=http://me:pw@proxy:3128).
_URL_PASSWORD = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^/\s:@]*):[^@\s/]*@")

# ANSI/VT escape sequences: CSI (ESC [ or the 8-bit \x9b, then parameters and a final byte),
# OSC (ESC ] ... BEL or ESC \), and any other ESC X pair.
_ESCAPES = re.compile(r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[@-_]?")
# C0 controls except \t and \n, DEL, C1 controls, and Unicode bidi overrides/isolates (these
# reorder what a reader sees, the "Trojan Source" trick).
_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def is_secret_name(name: str) -> bool:
    """True when a variable or setting called `name` should never have its value shown."""
    upper = name.upper()
    return any(part in upper for part in SECRET_NAME_PARTS)


def mask_url_password(text: str) -> str:
    """`text` with the password of any user:password@ URL in it replaced by MASK."""
    return _URL_PASSWORD.sub(rf"\g<head>:{MASK}@", text)


def mask_env(mapping: Mapping[str, str]) -> dict[str, str]:
    """A copy of an environment for display: secret-looking names get MASK as their value, and a
    password inside a URL value (proxies) is masked too."""
    return {name: MASK if is_secret_name(name) else mask_url_password(str(value)) for name, value in mapping.items()}


def strip_control(text: str) -> str:
    """`text` without terminal escape sequences or control characters (\\n and \\t are kept), so a
    server-provided string can go into UI text or a terminal without rewriting it."""
    return _CONTROLS.sub("", _ESCAPES.sub("", text))
