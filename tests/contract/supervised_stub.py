"""A supervisor that runs the stub server: its config, the launch spec, the phases it went through.

Shared by the supervisor's contract tests (test_supervisor_faults.py, test_supervisor_lifecycle.py).
Each case checks what the user sees (status text, error text and its `kind`) and that no
process is left (every `STUB_PID=` the stub printed, and every process group, is gone).
Waits are bounded polls, never timing assertions; speed is measured in bench/.

A stub start costs tens of seconds (it imports the real vLLM and vLLM-Omni), so related
cases share one server's life where they do not interfere: e.g. slow load, a job with
progress, a hard cancel, a crash after ready and the job after it run as one chain.
Knobs: VLLM_OMNI_STUB_* (see stub_vllm_serve.py), passed through LocalConfig.extra_env.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import stubserver

from vllm_omni_launcher.server.config.local_config import LocalConfig
from vllm_omni_launcher.server.launch.spec import LaunchSpec
from vllm_omni_launcher.server.registry import Status

TI2V = "Wan-AI/Wan2.2-TI2V-5B-Diffusers"
START_S = 420.0          # bound for one stub start (it imports vLLM on a small CI box)


# ---- helpers -------------------------------------------------------------------------------
def make_config(data_dir: Path, *, hang_timeout_s: float = 120.0, port: Optional[int] = None,
                **knobs: Any) -> LocalConfig:
    return LocalConfig(server_command=(stubserver.server_python(), str(stubserver.STUB_SCRIPT)),
                       data_dir=str(data_dir), port=port, hang_timeout_s=hang_timeout_s, startup_timeout_s=START_S,
                       extra_env={f"VLLM_OMNI_STUB_{k.upper()}": str(v) for k, v in knobs.items()})


def spec_for(gpus: Optional[tuple[int, ...]] = (0,), **changes: Any) -> LaunchSpec:
    return LaunchSpec(model=TI2V, gpus=gpus, **changes)


def phases_of(statuses: list[Status]) -> list[str]:
    out: list[str] = []
    for s in statuses:
        if not out or out[-1] != s.phase:
            out.append(s.phase)
    return out

