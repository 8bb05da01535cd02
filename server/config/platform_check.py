"""Refuse a local server where it cannot run: native Windows.

vLLM-Omni runs on Linux with NVIDIA GPUs; on Windows it runs inside WSL2, not natively. The
supervisor also needs POSIX process groups (os.setsid/killpg/getpgid) and flock for the GPU
lock. So the package must import on Windows (ComfyUI's most common platform: the Remote
Server node works there), and asking for a local server says why not and what to do instead,
before anything calls a POSIX-only function.
"""
from __future__ import annotations

import sys
from typing import Optional

from ...errors import LauncherError


def require_local_server_platform(platform: Optional[str] = None) -> None:
    """Raise a LauncherError on native Windows (`platform` defaults to sys.platform)."""
    if (platform or sys.platform) != "win32":
        return
    raise LauncherError(
        "A local vLLM-Omni server cannot run on Windows",
        "vLLM-Omni runs on Linux with NVIDIA GPUs; on Windows it runs inside WSL2, not natively",
        "inside WSL2 run `python -m vllm_omni_launcher setup`, then `python -m vllm_omni_launcher serve "
        "--model MODEL --port 8091 --api-key-file KEYFILE` (WSL2 forwards localhost to Windows); here, use "
        "the Remote Server node instead of Local Server, with http://localhost:8091 and that key named in the "
        "launcher config's remote_servers",
        setting="Local Server", kind="platform")
