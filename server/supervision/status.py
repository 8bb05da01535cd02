"""What a supervised server looks like from outside: its phase, a sentence, progress, errors.

`Status` is the immutable snapshot nodes, the CLI and status texts read; it holds no
secret. `StatusBoard` is the mutable side the supervisor writes: the phase machine's
current phase and text (startup phases from the log only move forward), startup progress,
the last error, fallback notes, warnings. A text may end in a note (a head's replica port, a
cancelled job's or an out-of-memory job's news), which the board keeps as `note` too: a reader
that words its own first part (Server Status) takes the note as it is instead of cutting the
text apart, where either part may hold "; " itself. The board tells one listener about each
change, and only about changes: a snapshot equal to the last one sent is not sent again. The
listener is whoever launches the server now (a node's run, a CLI command); a node unsubscribes
when its launch ends (`unlisten`), so the server's later life (keep-alive, crashes, Stop
Server) never writes to a node of another run, whose id may by then name an unrelated node.

Locking: the board shares the supervisor's lock. Changes are made under it; the listener is
called outside it, one call at a time and in snapshot order, so a listener may call back
into the supervisor. Callers must not hold the lock when they change the board.
"""
from __future__ import annotations

import itertools
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

from ...errors import LauncherError
from ..logs import logwatch
from ..logs.logwatch import PhaseChange, Progress

# Phases shown to the user, in startup order, plus the states around them.
STOPPED, STARTING, DOWNLOADING, LOADING, WARMUP, READY = ("stopped", logwatch.STARTING, logwatch.DOWNLOADING,
                                                          logwatch.LOADING, logwatch.WARMUP, logwatch.READY)
RESTARTING, STOPPING, FAILED = "restarting", "stopping", "failed"
STARTUP_ORDER = {p: i for i, p in enumerate(logwatch.PHASE_ORDER)}

_KEEP: Any = object()     # "leave the progress as it is"


@dataclass(frozen=True)
class Status:
    """A snapshot for nodes, the CLI and the status text. Holds no secret."""

    phase: str
    text: str
    ready: bool
    pid: Optional[int]
    port: Optional[int]
    url: Optional[str]
    generation: int
    fingerprint: str                       # the spec the server runs (after any fallback)
    last_error: Optional[str] = None       # what/why/fix of the last failure (raw log tail left out)
    last_error_kind: Optional[str] = None
    fallback_note: Optional[str] = None    # what automatic OOM fallback changed, if anything
    requested_fingerprint: str = ""
    restarts: int = 0
    log_path: Optional[str] = None
    warnings: tuple[str, ...] = ()
    restart_reason: Optional[str] = None   # why the last automatic restart happened (crash, hang, hard cancel)
    progress: Optional[Progress] = None    # (done, total or None, unit) while downloading, loading, warming up
    note: Optional[str] = None             # what `text` says after its first part ("Ready: ..."), as it is

    def noted(self, first: str) -> str:
        """`first` (a reader's own words for the text's first part) with this status's note, joined as the
        text joins them."""
        return with_note(first, self.note)


def with_note(text: str, note: Optional[str]) -> str:
    """The status text of a first part and its note: the one place the two are joined."""
    return f"{text}; {note}" if note else text


StatusCallback = Callable[[Status], None]


class StatusBoard:
    """The visible state of one supervisor, and its change-only notifications."""

    def __init__(self, lock: "threading.RLock", snapshot: Callable[[], Status]) -> None:
        self.lock = lock
        self.changed = threading.Condition(lock)
        self.phase, self.text = STOPPED, "Not started"
        self.note: Optional[str] = None
        self.progress: Optional[Progress] = None
        self.last_error: Optional[LauncherError] = None
        self.fallback_notes: list[str] = []
        self.warnings: list[str] = []
        self.restart_reason: Optional[str] = None
        self._snapshot = snapshot
        self._listener: Optional[StatusCallback] = None
        self._seq = itertools.count()
        self._sent_lock = threading.RLock()    # held while the listener runs: one at a time, in order
        self._sent: tuple[int, Optional[Status]] = (-1, None)

    # ---- reading -------------------------------------------------------------------------
    def fields(self) -> dict[str, Any]:
        """The board's part of a Status (call with the lock held)."""
        err = self.last_error
        return dict(phase=self.phase, text=self.text, note=self.note, progress=self.progress,
                    last_error=LauncherError(err.what, err.why, err.fix).text() if err is not None else None,
                    last_error_kind=(err.kind or None) if err is not None else None,
                    fallback_note="; ".join(self.fallback_notes) or None, warnings=tuple(self.warnings),
                    restart_reason=self.restart_reason)

    # ---- changing ------------------------------------------------------------------------
    def set(self, phase: Optional[str] = None, text: Optional[str] = None, progress: Any = _KEEP,
            note: Optional[str] = None) -> None:
        """Enter `phase` (None: stay) with `text` and its `note` (a new text without one has none); a new
        phase without progress clears it."""
        with self.lock:
            changed = self._apply(phase, text, progress, note)
        if changed:
            self.emit()

    def advance(self, change: PhaseChange) -> None:
        """A startup phase seen in the log: phases only move forward during one start, and the
        log no longer drives the phase once it is stopping, failed, ready..."""
        with self.lock:
            current = STARTUP_ORDER.get(self.phase)
            if current is None or (change.phase and STARTUP_ORDER[change.phase] < current):
                return
            changed = self._apply(change.phase, change.text, _KEEP if change.progress is None else change.progress)
        if changed:
            self.emit()

    def _apply(self, phase: Optional[str], text: Optional[str], progress: Any, note: Optional[str] = None) -> bool:
        before = (self.phase, self.text, self.progress)      # the text holds the note
        if phase is not None and phase != self.phase:
            self.phase = phase
            if progress is _KEEP:
                progress = None
        if text is not None:
            self.text, self.note = with_note(text, note), note or None
        if progress is not _KEEP:
            self.progress = progress
        self.changed.notify_all()
        return (self.phase, self.text, self.progress) != before

    def set_error(self, err: Optional[LauncherError]) -> None:
        with self.lock:
            self.last_error = err

    def add_note(self, note: str) -> None:
        with self.lock:
            self.fallback_notes.append(note)

    def add_warning(self, warning: str) -> None:
        with self.lock:
            if warning not in self.warnings:
                self.warnings.append(warning)

    def set_restart_reason(self, reason: str) -> None:
        with self.lock:
            self.restart_reason = reason

    def notify(self) -> None:
        """Wake `wait` callers after a change outside the board (ready, pending work)."""
        with self.lock:
            self.changed.notify_all()

    # ---- telling the listener ----------------------------------------------------------
    def listen(self, callback: StatusCallback, replay: bool = False) -> None:
        """Send every change to `callback` from now on (`replay`: the current status at once)."""
        self._listener = callback
        if replay:
            self.emit(force=True)

    def unlisten(self, callback: StatusCallback) -> None:
        """Stop telling `callback` (compared with ==, so a bound method may be passed again), unless
        another listener has replaced it. On return it is not being called and never will be again."""
        with self._sent_lock:
            if self._listener == callback:
                self._listener = None

    def emit(self, force: bool = False) -> None:
        """Tell the listener the current status unless it already has it (or a newer one)."""
        callback = self._listener
        if callback is None:
            return
        with self.lock:
            status, seq = self._snapshot(), next(self._seq)
        with self._sent_lock:
            last_seq, last = self._sent
            if self._listener is not callback or seq < last_seq or (status == last and not force):
                return                      # unsubscribed (or replaced) meanwhile, or already sent
            self._sent = (seq, status)
            try:
                callback(status)
            except Exception:  # noqa: BLE001 - a UI callback must never break supervision
                pass

    def wait(self, done: Callable[[], Optional[bool]], timeout: Optional[float]) -> bool:
        """Block until `done()` returns True (True) or False (False), or `timeout` (False)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.changed:
            while True:
                result = done()
                if result is not None:
                    return result
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self.changed.wait(0.5 if left is None else min(0.5, left))
