"""Every deadline of the supervisor, named once: how long a start may take, how long a stop waits.

A fixed startup timeout is wrong both ways: TI2V-5B is warm in about a minute on an H200,
while T2V-A14B reads 64 GiB of weights and compiles two experts, and a first start downloads
the whole repo (over 100 GB for A14B) before any of that. So the budget is a base for loading
and compiling, scaled by model size and slow options, plus a generous download allowance
when the weights are not on disk yet. The operator can override it in the local config.

The stop timeouts are what one stop may take from the first signal to a verified empty
process group (process_group.ServerProcess.stop spreads them over SIGINT/SIGTERM/SIGKILL).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping, Optional

from ..launch import hf_cache
from ..launch.spec import LaunchSpec

LOAD_BASE_S = {1: 15 * 60, 2: 30 * 60}          # by number of DiT experts: 5B, A14B
DOWNLOAD_ALLOWANCE_S = {1: 60 * 60, 2: 3 * 60 * 60}   # ~30 GB / ~120 GB at a slow 10-20 MB/s

# ---- stopping --------------------------------------------------------------------------
STOP_S = 30.0               # a requested stop: SIGINT (vLLM's graceful shutdown), SIGTERM, SIGKILL
REPLACE_STOP_S = 10.0       # a server being replaced or given up on (restart, failed start): no SIGINT
CANCEL_STOP_S = 1.0         # a cancelled start: SIGTERM, then SIGKILL; the group is gone well within 2 s
EXIT_STOP_S = 10.0          # ComfyUI is exiting (atexit, SIGTERM): little time, all servers in parallel
LEFT_BEHIND_STOP_S = 15.0   # a verified server an earlier ComfyUI left running, not wanted now
MONITOR_JOIN_S = 5.0
WATCHDOG_GRACE_S = 5.0      # the watchdog's SIGTERM-to-SIGKILL wait once this process is gone (watchdog.py --grace;
                            # the script cannot import this module, so its own fallback GRACE_S repeats it)
WATCHDOG_EXIT_S = 1.0       # the server died: its watchdog notices within one 0.25 s poll and exits with the
                            # server's code; four polls, then poll() says "still running" and asks again later
GUARD_EXIT_S = 2.0          # a guard watchdog keeps default signal handlers, so SIGTERM (then SIGKILL) ends it
                            # at once; each gets this long before we stop waiting on it

# ---- starting --------------------------------------------------------------------------
PORT_RELEASE_S = 10.0       # a killed server's port is released by the kernel a moment later
FIND_SERVER_CHILD_S = 30.0  # the watchdog starts the server at once; this only bounds a stuck fork
READY_CHILD_S = 5.0         # once the port answers, the server process exists: a second look, if the first missed it
READY_POLL_S = 0.1          # /health poll while starting (0.02 once the log says HTTP is coming up)
FAST_POLL_S = 0.02
DOWNLOAD_POLL_S = 1.0       # how often the HF cache folder is measured during a download

# ---- probes ----------------------------------------------------------------------------
HEALTH_PROBE_S = 1.0        # one /health call while starting (refused at once while loading)
MODELS_PROBE_S = 2.0        # one /v1/models call
ADOPT_HEALTH_S = 2.0        # /health of a left-behind server before adopting it
ADOPT_MODELS_S = 3.0
MONITOR_HEALTH_MAX_S = 5.0  # one /health call of a ready server (the monitor)
PROBE_S = 2.0               # probe.health / probe.served_models when the caller names no deadline: a local
                            # server's API process answers these in milliseconds, even mid-denoise
JOBS_PROBE_S = 5.0          # one GET /v1/videos (up to 100 jobs, a larger body) of a multi-host head; the
                            # stall watch polls it every few seconds and treats no answer as "no news"


def needs_download(spec: LaunchSpec, env: Optional[Mapping[str, str]] = None) -> bool:
    if Path(spec.model).expanduser().is_dir():
        return False
    return not hf_cache.has_snapshot(spec.model, env if env is not None else os.environ)


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


def startup_budget(spec: LaunchSpec, env: Mapping[str, str], requested: Optional[float],
                   configured: Optional[float]) -> float:
    """Seconds this start may take: the caller's timeout, else the local config's, else scaled."""
    if requested is not None:
        return float(requested)
    if configured:
        return float(configured)
    return startup_timeout(spec, env)
