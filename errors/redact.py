"""Keep secrets and terminal tricks out of what people see: reprs, logs and node text.

Two kinds of text leave the launcher for a human: settings we print (a config repr, the
`argv` command's environment) and strings a server sent us (job ids, error bodies, log lines).
The first may hold an operator's tokens; the second is untrusted and may carry escape
sequences that rewrite a terminal or hide text in the UI. This module is the one place that
decides what counts as a secret name and which characters are stripped, and caps how much of
a server's text is shown (`untrusted_text`): a hostile server's 64 KiB error body must not
become a 64 KiB node message.
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Optional

MASK = "***"

# Substrings of a variable name that mark its value as secret (HF_TOKEN, AWS_SECRET_ACCESS_KEY,
# VLLM_API_KEY, PGPASSWORD, GOOGLE_APPLICATION_CREDENTIALS...). Over-masking is harmless.
SECRET_NAME_PARTS = ("TOKEN", "KEY", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL")

# user:password@ inside a URL value (HTTPS_PROXY=http://me:pw@proxy:3128). Linear in the text's
# length (a server's error body is not ours to bound), by construction: a match may start only where
# a run of scheme characters starts (the lookbehind), so each run is scanned from one place, not from
# each of its characters (which made 30k letters take seconds); the scheme is then the run itself,
# needing a letter somewhere (the head is kept as it is, so where in the run the scheme begins does
# not matter). After "://", user and password stop at '/', and the next URL's "://" holds one, so the
# parts that each start scans do not overlap either.
_URL_PASSWORD = re.compile(
    r"(?<![A-Za-z0-9+.-])(?P<head>[0-9+.-]*[A-Za-z][A-Za-z0-9+.-]*://[^/\s:@]*):[^@\s/]*@")

# ANSI/VT escape sequences: CSI (ESC [ or the 8-bit \x9b, then parameters and a final byte),
# OSC (ESC ] ... BEL or ESC \), and any other ESC X pair.
_ESCAPES = re.compile(r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[@-_]?")
# C0 controls except \t and \n, DEL, C1 controls, and Unicode bidi overrides/isolates (these
# reorder what a reader sees, the "Trojan Source" trick).
_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
# Beyond those, every format character (Unicode category Cf, as of Unicode 14: soft hyphen,
# Arabic/Syriac marks, zero-width space/joiners U+200B-U+200D, LRM/RLM U+200E/U+200F, word joiner
# and invisible operators U+2060-U+2064, isolates U+2066-U+206F, BOM U+FEFF, interlinear
# annotation, tag characters U+E0000...) is invisible or reorders text, and lone surrogates
# cannot be shown at all. One compiled class, so a long line costs a regex pass, not a loop.
_INVISIBLE = re.compile(
    "[\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2\u180e\u200b-\u200f\u2060-\u2064"
    "\u206a-\u206f\ufeff\ufff9-\ufffb\ud800-\udfff\U000110bd\U000110cd\U00013430-\U00013438"
    "\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0001\U000e0020-\U000e007f]")
_LINE_BREAKS = re.compile("[\u2028\u2029]")     # line / paragraph separators: plain newlines

SERVER_TEXT_LIMIT = 4000       # characters of one server-provided text shown (an error body, a message)


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
    """`text` without terminal escape sequences, control characters (\\n and \\t are kept) or
    invisible format characters (zero-width, bidi marks and isolates, BOM: Unicode Cf), so a
    server-provided string can go into UI text or a terminal without rewriting or hiding anything."""
    text = _CONTROLS.sub("", _ESCAPES.sub("", text))
    if text.isascii():
        return text
    return _LINE_BREAKS.sub("\n", _INVISIBLE.sub("", text))


def untrusted_text(text: Optional[str], limit: int = SERVER_TEXT_LIMIT) -> str:
    """Server-provided `text` as the UI may show it: `strip_control`, then at most `limit`
    characters (a longer text ends with a note of how much was left out). The one gate for
    server text on its way into an error, a status line or a log message."""
    clean = strip_control(text or "")
    if len(clean) <= limit:
        return clean
    return clean[:limit] + f"… [{len(clean) - limit} more characters not shown]"
