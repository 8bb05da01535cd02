"""The Hugging Face cache the server downloads into, and how far a download has got.

`vllm serve` fetches a missing HF model in full before it loads anything, and vLLM-Omni
0.30 turns Hugging Face's own progress bars off for that (it passes a disabled tqdm), so
its log says nothing for the many minutes a 100 GB download takes. The bytes do show up on
disk, though: huggingface_hub writes each file as `blobs/<hash>.incomplete` in the model's
cache folder and renames it when done. Watching that folder grow is the download progress
(the total is not known before the server has listed the repo, so it is reported as None).
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Mapping, Optional


def hub_dir(env: Mapping[str, str]) -> Path:
    """Where the server's huggingface_hub caches repos (HF_HUB_CACHE, HF_HOME/hub, the default)."""
    if env.get("HF_HUB_CACHE"):
        return Path(env["HF_HUB_CACHE"]).expanduser()
    if env.get("HF_HOME"):
        return Path(env["HF_HOME"]).expanduser() / "hub"
    return Path("~/.cache/huggingface/hub").expanduser()


def repo_dir(model: str, env: Mapping[str, str]) -> Path:
    return hub_dir(env) / ("models--" + model.replace("/", "--"))


def has_snapshot(model: str, env: Mapping[str, str]) -> bool:
    """Whether the cache already holds a snapshot of `model` (a finished or resumed download)."""
    try:
        return any((repo_dir(model, env) / "snapshots").iterdir())
    except OSError:
        return False


def _blob_bytes(blobs: Path) -> int:
    total = 0
    try:
        with os.scandir(blobs) as entries:
            for entry in entries:
                try:
                    total += entry.stat(follow_symlinks=False).st_size
                except OSError:
                    continue            # renamed from .incomplete while we looked
    except OSError:
        return 0
    return total


class DownloadWatch:
    """Bytes the server has added to one model's cache folder since the launch began."""

    def __init__(self, model: str, env: Mapping[str, str], every_s: float = 1.0) -> None:
        self._blobs = repo_dir(model, env) / "blobs"
        self._base = _blob_bytes(self._blobs)
        self._every_s = every_s
        self._next = 0.0

    def due(self) -> bool:
        """True at most once per `every_s` (measuring walks the folder)."""
        now = time.monotonic()
        if now < self._next:
            return False
        self._next = now + self._every_s
        return True

    def downloaded(self) -> Optional[int]:
        """Bytes written since the watch began; None while nothing has arrived."""
        grown = _blob_bytes(self._blobs) - self._base
        return grown if grown > 0 else None
