"""When a server that was ready dies or hangs: restart it, how soon, and when to give up.

A crash after ready is usually transient (a dead worker, a driver hiccup), so the
supervisor restarts the server with a growing delay. A server that keeps dying is not
transient: after `max_restarts` restarts within `window_s` the supervisor stops trying and
says why, instead of burning the GPU in a loop. Restarts that the launcher causes on
purpose (freeing the GPU after a hard cancel) count against the same budget, so a workflow
that cancels in a loop cannot make the server restart forever either.

Pure bookkeeping (no threads, no I/O; the clock is injectable), so the give-up path is
tested without a server.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Optional

BACKOFF_S = (1.0, 2.0, 5.0, 10.0, 30.0, 60.0)
MAX_RESTARTS = 5
WINDOW_S = 30 * 60.0


@dataclass
class RestartPolicy:
    """The restart budget of one supervisor: at most `max_restarts` within `window_s`."""

    max_restarts: int = MAX_RESTARTS
    window_s: float = WINDOW_S
    backoff_s: tuple[float, ...] = BACKOFF_S
    clock: Callable[[], float] = time.monotonic
    _times: deque[float] = field(default_factory=deque, init=False, repr=False)

    def _expire(self) -> None:
        now = self.clock()
        while self._times and now - self._times[0] > self.window_s:
            self._times.popleft()

    def next_delay(self) -> Optional[float]:
        """Book one automatic restart: the seconds to wait before it, or None to give up
        (the budget of this window is spent; nothing is booked then)."""
        self._expire()
        if len(self._times) >= self.max_restarts:
            return None
        delay = self.backoff_s[min(len(self._times), len(self.backoff_s) - 1)]
        self._times.append(self.clock())
        return delay

    def book(self) -> None:
        """Count a restart the launcher made on purpose (no delay, never refused)."""
        self._expire()
        self._times.append(self.clock())

    @property
    def recent(self) -> int:
        """Restarts booked within the current window."""
        self._expire()
        return len(self._times)

    def reset(self) -> None:
        """A fresh start asked for by the user: the budget starts over."""
        self._times.clear()

    def give_up_text(self) -> str:
        return f"Gave up after {self.recent} restarts in {self.window_s / 60:g} minutes"
