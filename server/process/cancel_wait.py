"""Waiting that a cancel can end: the one shape of `should_cancel` callbacks and lock waits.

A start can wait on a lock another start holds (one get_or_start decision at a time in the
registry, one start per supervisor); ComfyUI's interrupt must still end that wait, and a broken
callback must not break the start it was meant to cancel.
"""
from __future__ import annotations

import threading
from typing import Callable, Optional

ShouldCancel = Callable[[], bool]
LOCK_POLL_S = 0.1               # how often a lock wait looks at the cancel flag


def quiet(should_cancel: Optional[ShouldCancel]) -> ShouldCancel:
    """`should_cancel` that never raises (an exception reads as "not cancelled")."""
    def asked() -> bool:
        try:
            return bool(should_cancel()) if should_cancel is not None else False
        except Exception:  # noqa: BLE001
            return False
    return asked


def acquire(lock: "threading.Lock | threading.RLock", cancel: ShouldCancel) -> bool:
    """Take `lock`, giving up (False) when `cancel()` turns true while another holder keeps it."""
    while not lock.acquire(timeout=LOCK_POLL_S):
        if cancel():
            return False
    return True
