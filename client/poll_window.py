"""When to ask a server about a job: every poll interval, and fast only in a short window around
the job's expected end.

A status GET costs the server well under a millisecond, and polling fast when a job is about
done is what makes its completion noticed within tens of milliseconds instead of half a poll
interval (0.125 s at 0.25 s). But "about done" is a guess: a client that polls every 10 ms from
its guess until the job ends sends thousands of requests a minute to a shared server as soon as
one job overruns (a 20 s job after 10 s ones: 933 requests). So fast polling is a window of
FAST_WINDOW_S, opened once per expected end, and the interval is the normal one before and
after it.

Where the expected end comes from (one mechanism for every caller: the nodes, `generate` in the
CLI, and a plain `VideoClient.generate()`):

* a hint (`due()`, optional): the caller knows the job is finishing. It answers a `Hint` level
  (a bool is read as DENOISED): a supervised server's log showed the job's last denoise step
  (DENOISED: VAE decode, postprocess and MP4 encode follow, ~6 s at 1280x704x121 on an H200),
  then the server's line that it stored the job's MP4 (STORED: the job's status turns completed
  right after it). Each rise to a higher level opens a window at once, or, when jobs of this
  kind here have shown how long they take after that level, LEAD_S before that time;
* what earlier jobs of the same kind on the same server took (`Expectations`, this process's
  memory; kind = everything of the request but its prompt, seed and image bytes): the window
  opens LEAD_S before the learned running time. The first job of a kind has no estimate and is
  polled at the normal interval only, unless a hint opens a window. The time after each hint
  level is learned without the denoise-only fields (steps, guidance, ...: `after_hint_kind`),
  since what follows the last denoise step (VAE decode, postprocess, MP4 encode) does not depend
  on them.

A hint that falls and rises again (a batch: each clip's last denoise step, then its MP4 stored)
opens a new window each time; one that stays at a level opens one. The hint is read from a log,
which is the server's untrusted text: it can only open windows, each of at most FAST_WINDOW_S
(FAST_WINDOW_S / FAST_POLL_S fast polls), and one job's cadence opens at most WINDOWS_PER_JOB of
them (its learned end, then one per level). The log parser counts the stored line once per
finished denoise run (server/logs/logwatch.py), so a server that prints it again and again, or
never completes the job, costs at most those windows' fast polls.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field, fields
from enum import IntEnum
from typing import Any, Callable, Hashable, Mapping, Optional, Union

from .transport import sleep_checking

FAST_POLL_S = 0.02      # poll interval inside the window; on an H200 at 1280x704x121 completion was
                        # noticed 0.022 s after inference_time_s at 0.02 s polls (0.035 s at 0.04 s);
                        # 0.01 s saves about 0.005 s more for twice the requests
FAST_WINDOW_S = 1.5     # how long one window lasts: at most FAST_WINDOW_S / FAST_POLL_S = 75 fast polls
LEAD_S = 0.5            # a learned end opens its window this much early (a poll interval of jitter in
                        # when the job was seen starting, plus the job's own spread)
HINT_CHECK_S = 0.005    # once the hint says DENOISED, how often it is read between polls (a local read, no
                        # request), so the rise to STORED is polled on within this rather than within FAST_POLL_S
_LEARN_WEIGHT = 0.5     # the newest job's share in a learned time (a moving average)


class Hint(IntEnum):
    """How near its end a caller's hint says the job is (`due()`'s answer; False/True read as NONE/DENOISED)."""

    NONE = 0
    DENOISED = 1    # the log showed the job's last denoise step: decode, postprocess and MP4 encode follow
    STORED = 2      # the log showed the server storing the job's MP4: its status turns completed next


Due = Callable[[], Union[int, bool]]     # a caller's hint: a Hint level (or a bool)
WINDOWS_PER_JOB = len(Hint)     # what one job's cadence may open: its learned end, then one per level above NONE


@dataclass
class Expectation:
    """What earlier jobs of one kind on one server took (seconds): from the first poll that saw
    them running to the poll that saw them done, and from each hint level's rising edge to done."""

    run_s: Optional[float] = None
    after_hint_s: dict[int, float] = field(default_factory=dict)


# Request fields that act on the denoise loop only. What follows a job's last denoise step (the hint), the
# server's VAE decode, postprocess and MP4 encode, does not depend on them (vLLM-Omni 0.30, one H200, 1280x704x121:
# about 6 s at 4 and at 20 steps, bench/results/h200-levers-vllm-omni-0.30/), so the time after the hint is
# learned per kind without them: a new step count is then detected as fast as the kind it shares a shape with.
DENOISE_ONLY = frozenset({"steps", "guidance", "guidance_2", "boundary_ratio", "flow_shift", "sampler"})


def after_hint_kind(kind: Hashable) -> Hashable:
    """`kind` (job_kind's pairs) without the denoise-only fields."""
    if not isinstance(kind, tuple):
        return kind
    return tuple(p for p in kind if not (isinstance(p, tuple) and len(p) == 2 and p[0] in DENOISE_ONLY))


class Expectations:
    """This process's learned job times: running time by (server URL, job kind), the time after each hint level
    by (server URL, `after_hint_kind`, level). Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._run: dict[tuple[str, Hashable], Optional[float]] = {}
        self._after: dict[tuple[str, Hashable, int], Optional[float]] = {}

    def get(self, url: str, kind: Hashable) -> Expectation:
        after_kind = after_hint_kind(kind)
        with self._lock:
            after = {level: self._after.get((url, after_kind, level)) for level in Hint if level}
            return Expectation(self._run.get((url, kind)), {k: v for k, v in after.items() if v is not None})

    def learn(self, url: str, kind: Hashable, run_s: Optional[float], after_hint_s: Mapping[int, float]) -> None:
        """Blend in one finished job: its running time and, per hint level it saw rise, the time after it."""
        after_kind = after_hint_kind(kind)
        with self._lock:
            key = (url, kind)
            self._run[key] = _blend(self._run.get(key), run_s)
            for level, seconds in after_hint_s.items():
                after_key = (url, after_kind, int(level))
                self._after[after_key] = _blend(self._after.get(after_key), seconds)

    def clear(self) -> None:
        with self._lock:
            self._run.clear()
            self._after.clear()


def _blend(old: Optional[float], new: Optional[float]) -> Optional[float]:
    if new is None or new < 0:
        return old
    return new if old is None else (1 - _LEARN_WEIGHT) * old + _LEARN_WEIGHT * new


LEARNED = Expectations()


def job_kind(request: Any) -> Hashable:
    """What decides how long a job takes: every field of the request but its texts, seed and image
    bytes (an image's presence counts)."""
    skip = {"prompt", "negative_prompt", "seed", "image_png"}
    parts: list[Any] = [("image", getattr(request, "image_png", None) is not None)]
    for f in fields(request):
        if f.name not in skip:
            value = getattr(request, f.name)
            parts.append((f.name, tuple(sorted(value.items())) if isinstance(value, dict) else value))
    return tuple(parts)


@dataclass
class PollCadence:
    """The sleeps between one poll loop's status requests (see the module docstring).

    `expected`: what earlier jobs of this kind took here. Call `running(now)` when a poll first
    sees the job running, `wait()` between polls, and `finished(now)` with the poll that saw it
    done (it returns the times to learn). `max_windows`: how many windows this cadence may open
    (None: no limit, for a batch's rounds, whose hint rises once per clip and level)."""

    poll_s: float
    due: Optional[Due] = None
    expected: Expectation = field(default_factory=Expectation)
    clock: Callable[[], float] = time.monotonic
    max_windows: Optional[int] = WINDOWS_PER_JOB
    running_at: Optional[float] = None
    hint_at: dict[int, float] = field(default_factory=dict)   # each hint level's latest rising edge
    fast_polls: int = 0                      # fast sleeps taken (what the windows cost)
    windows: int = 0                         # windows opened
    _level: int = Hint.NONE
    _window: Optional[tuple[float, float]] = None

    def running(self, now: float) -> None:
        """A poll saw the job running (only the first call counts)."""
        if self.running_at is None:
            self.running_at = now
            if self.expected.run_s is not None and self._window is None:
                self._open(now + self.expected.run_s - LEAD_S)

    def _open(self, start: float) -> None:
        """A window from `start`, unless this cadence has opened all it may."""
        if self.max_windows is not None and self.windows >= self.max_windows:
            return
        self.windows += 1
        self._window = (start, start + FAST_WINDOW_S)

    def _look(self, now: float) -> None:
        """Read the hint; a rise to a higher level opens a new window."""
        if self.due is None:
            return
        level = _level_of(self.due)
        if level > self._level:
            self.hint_at[level] = now
            after = self.expected.after_hint_s.get(level)
            self._open(now if after is None else max(now, now + after - LEAD_S))
        self._level = level

    def near_end(self) -> bool:
        """Has the job reached its expected end (its window opened, now or earlier)?"""
        now = self.clock()
        self._look(now)
        return self._window is not None and now >= self._window[0]

    def wait(self, sleep: Callable[[float], None], should_cancel: Optional[Callable[[], bool]]) -> None:
        """Sleep until the next poll: FAST_POLL_S inside the window, else the poll interval, cut
        short when the hint opens a window meanwhile (it is read every FAST_POLL_S, and every
        HINT_CHECK_S once it says DENOISED: the rise to STORED means the job is completed now)."""
        now = self.clock()
        self._look(now)
        if self._window is not None and self._window[0] <= now < self._window[1]:
            self.fast_polls += 1
            self._sleep_watching(FAST_POLL_S, sleep, should_cancel)
            return
        left = self.poll_s
        if self._window is not None and now < self._window[0]:
            left = min(left, self._window[0] - now)
        self._sleep_watching(left, sleep, should_cancel)

    def _sleep_watching(self, seconds: float, sleep: Callable[[float], None],
                        should_cancel: Optional[Callable[[], bool]]) -> None:
        """Sleep `seconds`, reading the hint (if any) between slices; a rise that opens a window ends it."""
        left = seconds
        while left > 0:
            if self.due is None:
                step = left
            else:
                step = min(left, HINT_CHECK_S if self._level >= Hint.DENOISED else FAST_POLL_S)
            sleep_checking(step, should_cancel, sleep)
            left -= step
            if self.due is not None:
                opened = self._window
                self._look(self.clock())
                if self._window is not opened:
                    return                    # the hint just opened a window: poll now

    def finished(self, now: float) -> tuple[Optional[float], dict[int, float]]:
        """The poll at `now` saw the job done: (running -> done, {hint level: its rise -> done}) seconds to learn."""
        run_s = now - self.running_at if self.running_at is not None else None
        return run_s, {level: now - at for level, at in self.hint_at.items()}


def _level_of(due: Due) -> int:
    """`due()` as a Hint level, where a failing callback or an answer out of range only means "not due"
    (it is a speed hint)."""
    try:
        level = int(due())
    except Exception:  # noqa: BLE001
        return Hint.NONE
    return level if Hint.NONE <= level <= max(Hint) else Hint.NONE
