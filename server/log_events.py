"""What a supervisor does with each segment of its server's log, and with the download's size.

Every segment the log follower reads (log_follower.py splits on both `\\r` and `\\n`) comes
here: denoise bars feed the progress tracker (and count as activity for the keep-alive), the
"HTTP server up" line hurries the readiness poll, the vLLM version line and a version
mismatch warning are kept, a CUDA out-of-memory line after ready is a job that ran out of
memory (recovery.py reacts), and before ready the startup lines move the phase machine
forward (logwatch.py parses them). While starting, the Hugging Face cache folder growing is
the download's progress.

`LogEvents` is a mixin of `Supervisor` (supervisor.py), split out like recovery.py; the
annotations below are the supervisor state and methods it relies on.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Optional

from . import logwatch
from .hf_cache import DownloadWatch
from .logwatch import PhaseChange
from .status import DOWNLOADING, STARTING, WARMUP, StatusBoard

if TYPE_CHECKING:
    from .cancel_policy import LaunchClock
    from .logwatch import ProgressTracker
    from .server_run import ServerRun

VERSION_NOTE = ("vLLM and vLLM-Omni in the server environment have different major/minor versions; "
                "re-create it with server/create_server_env.sh")


class LogEvents:
    """The log's and the download's effects on a Supervisor."""

    if TYPE_CHECKING:      # provided by Supervisor
        _board: StatusBoard
        _progress: "ProgressTracker"
        _run: Optional["ServerRun"]
        _ready: bool
        _last_activity: float
        _server_version: Optional[tuple[int, int]]
        _launch_clock: "LaunchClock"

        def _on_job_oom(self, text: str) -> None: ...

    def _on_segment(self, text: str, ends_line: bool) -> None:
        """One log segment (the follower's callback, on its thread)."""
        if self._progress.feed(text):
            self._last_activity = time.time()
            if logwatch.bar_text(text) == logwatch.strip_prefix(text).rstrip():
                return                         # a pure redraw; else a log line is glued after it
        if logwatch.is_server_up(text) and self._run is not None:
            self._run.hurry()
        version = logwatch.server_version(text)
        if version is not None:
            self._server_version = version
        if logwatch.is_version_mismatch(text):
            self._board.add_warning(VERSION_NOTE)
        if self._ready:
            if logwatch.is_oom_line(text):
                self._on_job_oom(text)
            return
        change = logwatch.parse_phase(text)
        if change is None and self._board.phase == WARMUP:
            change = logwatch.warmup_step(text)
        if change is not None:
            self._board.advance(change)
            self._launch_clock.phase(self._board.phase == DOWNLOADING)

    def _show_download(self, download: Optional[DownloadWatch]) -> None:
        """While starting: the HF cache folder growing is the download's progress."""
        if download is None or self._board.phase not in (STARTING, DOWNLOADING) or not download.due():
            return
        got = download.downloaded()
        if got:
            mb = round(got / 1e6, 1)
            self._board.advance(PhaseChange(DOWNLOADING, f"Downloading weights into the Hugging Face cache: "
                                                         f"{mb:.0f} MB so far", (mb, None, "MB")))
            self._launch_clock.phase(self._board.phase == DOWNLOADING)
