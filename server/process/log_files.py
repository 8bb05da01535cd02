"""The server's log files: one per launch under `<data_dir>/logs`, the last few kept.

Each launch (every generation of every server) gets a new file named after the model,
the spec fingerprint, the time and the generation, so a crash report can point at the
exact run. The first line is ours: the argv and the environment additions, with the API
key masked. The files are 0600 in a 0700 directory (they hold prompts and paths), never
opened through a link (a linked `logs/` or log file is refused: private_files.py). Older
files are deleted beyond LOGS_KEPT, except those of servers still running (of this or any
other launcher process sharing the data dir: their state files name their logs).
"""
from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Any, Iterable, Mapping

from ..launch.spec import LaunchSpec
from ..storage import private_files, state_file

LOGS_KEPT = 10


def logs_dir(data_dir: str) -> Path:
    return private_files.private_dir(data_dir, "logs")


def open_log(data_dir: str, spec: LaunchSpec, generation: int, shown: Mapping[str, Any],
             keep: Iterable[str] = ()) -> tuple[str, int]:
    """Create the log of one launch; returns its path and a write descriptor (the caller
    hands it to the server as stdout/stderr and closes it)."""
    directory = logs_dir(data_dir)
    in_use = set(keep) | {st.log_path for _, st in state_file.read_all(data_dir) if st is not None}
    prune(directory, in_use)
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", spec.served_name.strip("/").split("/")[-1])[:60]
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = directory / f"{name}-{spec.fingerprint()}-{stamp}-g{generation}.log"
    fd = private_files.open_private(path)
    env = ", ".join(f"{k}={v}" for k, v in shown["env"].items())
    header = (f"[vllm-omni-launcher] {time.strftime('%Y-%m-%d %H:%M:%S')} generation {generation}: "
              f"{' '.join(shown['argv'])} (env: {env})\n")
    try:
        private_files.write_all(fd, header.encode(), path)
    except BaseException:
        os.close(fd)
        raise
    return str(path), fd


def prune(directory: Path, in_use: set[str], kept: int = LOGS_KEPT) -> None:
    """Delete the oldest logs (and their rotated `.1` parts) so that, with the one about to
    be created, at most `kept` remain besides those in use."""
    existing = sorted((p for p in directory.glob("*.log") if str(p) not in in_use), key=_mtime)
    for old in existing[:max(0, len(existing) - (kept - 1))]:
        for victim in (old, old.with_name(old.name + ".1")):
            try:
                victim.unlink()
            except OSError:
                pass


def _mtime(path: Path) -> float:
    try:
        return path.lstat().st_mtime
    except OSError:
        return 0.0
