"""The prestart in progress (prestart.py), so that a launch queued meanwhile says it is waiting for it.

A Local Server queued while `prestart_last_server` starts its server waits on the registry's start lock
(`get_or_start` tells it so through `on_wait`), then reuses that server, or replaces it where its own
choices differ. Without this its node would say "Planning the launch" for the whole wait. prestart.py
marks its start here and session.launch_local asks `waiting_text`; apart from prestart.py, which imports
session.py.
"""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Iterator, Optional

from ..server.storage.last_server import SETTING

_lock = threading.Lock()
_started: Optional[float] = None      # time.monotonic() when the prestart in progress began
_thread: Optional[threading.Thread] = None   # the prestart's (its own launch never waits for itself)
_fingerprint = ""                     # the server it starts, once planned


@contextmanager
def running() -> Iterator[None]:
    """Mark a prestart as in progress for the block (prestart.py's thread)."""
    global _started, _thread, _fingerprint
    with _lock:
        _started, _thread, _fingerprint = time.monotonic(), threading.current_thread(), ""
    try:
        yield
    finally:
        with _lock:
            _started, _thread, _fingerprint = None, None, ""


def planned(fingerprint: str) -> None:
    """The prestart's plan is made: `fingerprint` is the server it starts."""
    global _fingerprint
    with _lock:
        _fingerprint = fingerprint


def waiting_text(fingerprint: str) -> str:
    """What a launch of `fingerprint` shows while another start holds the registry's start lock."""
    with _lock:
        started, theirs = _started, _fingerprint
        if _thread is threading.current_thread():
            started = None
    if started is None:
        return "Waiting for another server start in this ComfyUI to finish; this launch goes on after it"
    then = ("this node uses that server once it is ready" if theirs == fingerprint else
            "this node asks for a different server (its choices differ from the recorded ones), so it starts "
            "its own once that start ends, stopping that one where they share GPUs")
    return (f"Waiting for the server {SETTING} is starting (started {time.monotonic() - started:.0f} s ago, "
            f"when ComfyUI loaded the pack): {then}")
