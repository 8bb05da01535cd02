"""How long a start may take before we call it stuck.

A fixed timeout is wrong both ways: TI2V-5B is warm in about a minute on an H200, while
T2V-A14B reads 64 GiB of weights and compiles two experts, and a first start downloads the
whole repo (over 100 GB for A14B) before any of that. So the budget is a base for loading
and compiling, scaled by model size and slow options, plus a generous download allowance
when the weights are not on disk yet. The operator can override it in the local config.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping, Optional

from .spec import LaunchSpec

LOAD_BASE_S = {1: 15 * 60, 2: 30 * 60}          # by number of DiT experts: 5B, A14B
DOWNLOAD_ALLOWANCE_S = {1: 60 * 60, 2: 3 * 60 * 60}   # ~30 GB / ~120 GB at a slow 10-20 MB/s


def _hf_cache_has(model: str, env: Mapping[str, str]) -> bool:
    """Whether the Hugging Face cache the server will use already holds a snapshot of `model`."""
    hub = env.get("HF_HUB_CACHE") or (Path(env["HF_HOME"]) / "hub" if env.get("HF_HOME") else None)
    hub = Path(hub) if hub else Path("~/.cache/huggingface/hub").expanduser()
    snapshots = hub / ("models--" + model.replace("/", "--")) / "snapshots"
    try:
        return any(snapshots.iterdir())
    except OSError:
        return False


def needs_download(spec: LaunchSpec, env: Optional[Mapping[str, str]] = None) -> bool:
    if Path(spec.model).expanduser().is_dir():
        return False
    return not _hf_cache_has(spec.model, env if env is not None else os.environ)


def startup_timeout(spec: LaunchSpec, env: Optional[Mapping[str, str]] = None) -> float:
    """Default seconds from launch to ready for this spec (no config override applied)."""
    try:
        experts = spec.family.experts
    except Exception:  # noqa: BLE001 - unknown model: assume the large one
        experts = 2
    budget = float(LOAD_BASE_S.get(experts, LOAD_BASE_S[2]))
    if spec.memory.offload == "layerwise":
        budget *= 1.5                       # block-wise offload streams weights through host RAM
    if needs_download(spec, env):
        budget += DOWNLOAD_ALLOWANCE_S.get(experts, DOWNLOAD_ALLOWANCE_S[2])
    return budget
