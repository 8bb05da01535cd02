"""Progress for a video job: real denoise steps (local) or a learned estimate (remote).

The HTTP API has no progress (0 then 100). For a server we supervise, the supervisor parses
the rank-0 tqdm lines from its stderr, so the bar shows real steps and ETA. For a remote
server we only know elapsed time, so we compare it to how long similar jobs took here.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Callable, Optional

_lock = threading.Lock()
_seconds_per_unit: dict[tuple[str, str], float] = {}   # (url, family) -> running seconds per (token x step)


def work_units(width: int, height: int, frames: int, steps: int) -> float:
    """Job size proxy: latent tokens x denoise steps."""
    return (width / 16) * (height / 16) * ((frames - 1) // 4 + 1) * max(1, steps)


def learn(url: str, family: str, units: float, running_s: float) -> None:
    if units > 0 and running_s > 0:
        with _lock:
            old = _seconds_per_unit.get((url, family))
            new = running_s / units
            _seconds_per_unit[(url, family)] = new if old is None else 0.5 * old + 0.5 * new


def estimate(url: str, family: str, units: float) -> Optional[float]:
    with _lock:
        rate = _seconds_per_unit.get((url, family))
    return rate * units if rate is not None else None


def _clock(seconds: float) -> str:
    seconds = int(max(0, seconds))
    return f"{seconds // 60}:{seconds % 60:02d}" if seconds >= 60 else f"{seconds}s"


@dataclass
class JobProgress:
    """Turns poll updates into a ProgressBar position and the status text under the node."""

    bar: Any
    send_text: Callable[[str], None]
    steps: int
    local_progress: Optional[Callable[[], Any]] = None   # supervisor.progress
    run_floor: int = -1                                  # denoise runs up to this id belong to earlier jobs
    remote_estimate_s: Optional[float] = None

    def on_update(self, update: Any) -> None:
        status = update.status
        if status == "queued":
            self.send_text(f"Queued {_clock(update.queued_s)}")
            return
        if status != "in_progress":
            return
        step = total = None
        eta = None
        if self.local_progress is not None:
            progress = self.local_progress()
            if progress is not None and progress.run_id > self.run_floor:
                step, total, eta = progress.step, progress.total, progress.eta_s
        if step is not None and total:
            self.bar.update_absolute(step, total)
            if step >= total:
                self.send_text(f"Decoding video… (denoise done in {_clock(update.running_s)})")
            else:
                eta_text = f", ETA {_clock(eta)}" if eta is not None else ""
                self.send_text(f"Step {step}/{total}, {_clock(update.running_s)} elapsed{eta_text}")
            return
        if self.remote_estimate_s:
            fraction = min(0.99, update.running_s / self.remote_estimate_s)
            self.bar.update_absolute(int(fraction * self.steps), self.steps)
            left = max(0.0, self.remote_estimate_s - update.running_s)
            self.send_text(f"Running {_clock(update.running_s)} (~{_clock(left)} left, estimated)")
        else:
            self.bar.update_absolute(0, self.steps)
            self.send_text(f"Running {_clock(update.running_s)} (first job on this server: no estimate yet)")

    def finish(self) -> None:
        """The job is done: fill the bar (the last poll may have come before the last step)."""
        self.bar.update_absolute(self.steps, self.steps)
