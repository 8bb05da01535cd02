"""What each segment of a server's log, and the download's size, change for its supervisor.

Every segment the log follower reads (log_follower.py splits on both `\\r` and `\\n`) comes
here: denoise bars feed the progress tracker (and count as use for the keep-alive), the
"HTTP server up" line hurries the readiness poll, the vLLM version line is kept and a version
mismatch warned about, a CUDA out-of-memory line after ready is a job that ran out of memory
(handed on), and before ready the startup lines move the phase machine forward (logwatch.py
parses them). While starting, the Hugging Face cache folder growing is the download's progress.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Optional

from ..launch.hf_cache import DownloadWatch
from ..logs import logwatch
from ..logs.logwatch import PhaseChange
from .status import DOWNLOADING, STARTING, WARMUP, StatusBoard

if TYPE_CHECKING:
    from ..logs.logwatch import ProgressTracker
    from ..process.server_run import ServerRun
    from .cancel_policy import LaunchClock

VERSION_NOTE = ("vLLM and vLLM-Omni in the server environment have different major/minor versions; "
                "re-create it with server/create_server_env.sh")


class LogEvents:
    """The log's and the download's effects on one server's board, progress and start clock.

    `run`: the current generation (its readiness poll is hurried); `ready`: whether it has been
    ready (then the log no longer drives the phase); `used`: a denoise bar was seen; `job_oom`:
    an out-of-memory line after ready (the line)."""

    def __init__(self, board: StatusBoard, progress: "ProgressTracker", launch_clock: "LaunchClock", *,
                 run: Callable[[], Optional["ServerRun"]], ready: Callable[[], bool], used: Callable[[], None],
                 job_oom: Callable[[str], None]) -> None:
        self._board = board
        self._progress = progress
        self._launch_clock = launch_clock
        self._run, self._ready, self._used, self._job_oom = run, ready, used, job_oom
        self.server_version: Optional[tuple[int, int]] = None     # (major, minor) from the log, once seen

    def on_segment(self, text: str, ends_line: bool) -> None:
        """One log segment (the follower's callback, on its thread)."""
        if self._progress.feed(text):
            self._used()
            if logwatch.bar_text(text) == logwatch.strip_prefix(text).rstrip():
                return                         # a pure redraw; else a log line is glued after it
        run = self._run()
        if logwatch.is_server_up(text) and run is not None:
            run.hurry()
        version = logwatch.server_version(text)
        if version is not None:
            self.server_version = version
        if logwatch.is_version_mismatch(text):
            self._board.add_warning(VERSION_NOTE)
        if self._ready():
            if logwatch.is_oom_line(text):
                self._job_oom(text)
            return
        change = logwatch.parse_phase(text)
        if change is None and self._board.phase == WARMUP:
            change = logwatch.warmup_step(text)
        if change is not None:
            self._board.advance(change)
            self._launch_clock.phase(self._board.phase == DOWNLOADING)

    def show_download(self, download: Optional[DownloadWatch]) -> None:
        """While starting: the HF cache folder growing is the download's progress."""
        if download is None or self._board.phase not in (STARTING, DOWNLOADING) or not download.due():
            return
        got = download.downloaded()
        if got:
            mb = round(got / 1e6, 1)
            self._board.advance(PhaseChange(DOWNLOADING, f"Downloading weights into the Hugging Face cache: "
                                                         f"{mb:.0f} MB so far", (mb, None, "MB")))
            self._launch_clock.phase(self._board.phase == DOWNLOADING)
