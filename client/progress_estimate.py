"""How far along a remote job is, from time alone: the HTTP API has no job progress.

A remote job's bar is its elapsed time against what jobs of its kind took on that server
(poll_window.py learns that): it grows past the estimate rather than sitting at "~0s left", and
never reaches the end before the job does. The first job of its kind has no estimate: its bar moves
with the time elapsed (half-way at ELAPSED_HALF_S, never full).
"""
from __future__ import annotations

ELAPSED_HALF_S = 60.0                                   # without an estimate, the bar is half-way after this


def estimated_fraction(running_s: float, estimate_s: float) -> float:
    """Share of the job done: linear to 80 % of the estimate, then towards (never reaching) 1 from the
    same slope: an overrunning job still moves and never looks done, as if the estimate kept growing."""
    knee = 0.8 * estimate_s
    if running_s <= knee:
        return running_s / estimate_s
    tail = estimate_s - knee
    return 1.0 - 0.2 * tail / (tail + running_s - knee)


def elapsed_fraction(running_s: float) -> float:
    """The bar of a job with no estimate: it moves with the time elapsed and is never full."""
    running_s = max(0.0, running_s)
    return running_s / (running_s + ELAPSED_HALF_S)
