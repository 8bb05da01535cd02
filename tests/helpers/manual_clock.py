"""A clock that moves only when a test moves it: for the supervisor's parts that take an injectable
clock (the restart budget, the keep-alive, the progress tracker), so time-based rules are tested
without waiting."""
from __future__ import annotations


class Clock:
    """Callable like time.monotonic / time.time; `now` is set or advanced by the test."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
