"""The Hugging Face cache the server downloads into, and how far a download has got.

`vllm serve` fetches a missing HF model in full before it loads anything, and vLLM-Omni
0.30 turns Hugging Face's own progress bars off for that (it passes a disabled tqdm), so
its log says nothing for the many minutes a 100 GB download takes. The bytes do show up on
disk, though: huggingface_hub writes each file as `blobs/<hash>.incomplete` in the model's
cache folder and renames it when done. Watching that folder grow is the download progress
(the total is not known before the server has listed the repo, so it is reported as None).

The same cache decides whether an offline server can start at all: Wan2.2 S2V's original layout
takes its VAE config from another repo (errors/failure_patterns.py, WAN_VAE_CONFIG_REPO), so a
launch with offline mode on and that file not cached is refused here, before anything starts.
Where the cache is, whether offline mode is on and how a cached file is found follow
huggingface_hub 1.33 (constants.py, file_download.py), for the server's environment, not ours.
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from string import Template
from typing import Mapping, Optional

from ...errors import failure_patterns as patterns
from ...models import WanFamily
from ..logs.failures import ServerFailure, vae_config_text

_TRUE = {"1", "ON", "YES", "TRUE"}          # huggingface_hub's ENV_VARS_TRUE_VALUES


def _path(value: str, env: Mapping[str, str]) -> str:
    """`value` with ~ and $VARS expanded as huggingface_hub does, from the server's variables."""
    return Template(os.path.expanduser(value)).safe_substitute(env)


def hub_dir(env: Mapping[str, str]) -> Path:
    """Where the server's huggingface_hub caches repos: HF_HUB_CACHE, else the legacy
    HUGGINGFACE_HUB_CACHE, else HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub, else ~/.cache/..."""
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if env.get(name):
            return Path(_path(env[name], env))
    home = env.get("HF_HOME") or os.path.join(env.get("XDG_CACHE_HOME") or "~/.cache", "huggingface")
    return Path(_path(home, env)) / "hub"


def offline_setting(env: Mapping[str, str]) -> Optional[str]:
    """The variable that puts the server's huggingface_hub in offline mode ("HF_HUB_OFFLINE=1"), or None.
    huggingface_hub reads HF_HUB_OFFLINE, and TRANSFORMERS_OFFLINE only when HF_HUB_OFFLINE is unset or empty."""
    name = "HF_HUB_OFFLINE" if env.get("HF_HUB_OFFLINE") else "TRANSFORMERS_OFFLINE"
    value = env.get(name) or ""
    return f"{name}={value}" if value.upper() in _TRUE else None


def cached_file(repo: str, filename: str, env: Mapping[str, str], revision: str = "main") -> Optional[Path]:
    """The cached copy of `repo`'s `filename` that an offline hf_hub_download would return, or None: refs/<revision>
    names the snapshot (read as written, as huggingface_hub does), and the file must exist in it (a link to a
    missing blob does not)."""
    folder = repo_dir(repo, env)
    try:
        commit = (folder / "refs" / revision).read_text()
    except (OSError, UnicodeDecodeError):
        return None
    path = folder / "snapshots" / commit / filename
    return path if commit and os.path.exists(path) else None


def needs_wan_vae_config(model: str, family: WanFamily) -> bool:
    """Whether the server will read the Wan VAE config from the HF cache or the Hub: S2V, unless the
    folder has the Diffusers layout (tokenizer/ and vae/, upstream's `_is_diffusers_format`)."""
    folder = Path(model).expanduser()
    return family.pipeline == "s2v" and not ((folder / "tokenizer").is_dir() and (folder / "vae").is_dir())


def wan_vae_config_refusal(model: str, family: WanFamily, env: Mapping[str, str]) -> Optional[ServerFailure]:
    """The refusal for an S2V launch whose server runs offline and whose cache lacks the Wan VAE config
    (the server would die at load with upstream's WAN_VAE_CONFIG_LINE), else None."""
    offline = offline_setting(env)
    if not offline or not needs_wan_vae_config(model, family) or \
            cached_file(patterns.WAN_VAE_CONFIG_REPO, patterns.WAN_VAE_CONFIG_FILE, env):
        return None
    kind, what, why, fix, setting = vae_config_text(str(hub_dir(env)), f"{offline} is set for the server, so it may "
                                                    "not ask the Hub, and the cache does not hold it")
    return ServerFailure(kind, what, why, fix, setting=setting)


def require_wan_vae_config(model: str, family: WanFamily, env: Mapping[str, str]) -> None:
    """Refuse the launch (before anything starts) when `wan_vae_config_refusal` says so."""
    refusal = wan_vae_config_refusal(model, family, env)
    if refusal is not None:
        raise refusal


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
