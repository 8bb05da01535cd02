"""The keep-alive rule: a ready server that no job used for keep_alive_minutes is idle.

Use is a job submitted or polled, a denoise bar in the server's log, or the server becoming
ready; a denoise that is running right now is never idle, whatever the clock says (a job's
polls can be minutes apart). Stopping the idle server is the supervisor's (recovery.py); this
part only says when.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from ..logs.logwatch import ProgressTracker


class KeepAlive:
    """The idle clock of one server. `minutes` <= 0: never idle (the registry may change it)."""

    def __init__(self, minutes: float, clock: Callable[[], float] = time.time) -> None:
        self.minutes = minutes
        self._clock = clock
        self._last_use = clock()

    def touch(self) -> None:
        """The server was just used: the idle time starts again."""
        self._last_use = self._clock()

    def expired(self, progress: "ProgressTracker") -> bool:
        """Whether the server has been idle for `minutes` (`progress`: its denoise bars)."""
        minutes = self.minutes or 0
        if minutes <= 0:
            return False
        cur = progress.current()
        if cur is not None and not cur.done and not cur.aborted:
            return False                     # a denoise is running right now
        return self._clock() - max(self._last_use, progress.last_seen) >= minutes * 60

    def stopped_text(self) -> str:
        return (f"Stopped after {self.minutes:g} idle minute(s) to free the GPUs; "
                "the next job starts it again")
