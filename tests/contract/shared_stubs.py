"""The stub servers that contract tests share for a whole session (``stub_pool`` fixture).

A stub start costs a vLLM import (tens of seconds on a small CI box), so the plain
configurations that many tests drive with ordinary requests run once per session, in
``tests/contract/conftest.py``'s :class:`stub_pool.StubPool`; a test takes one with
``with stub_pool.lease(NAME) as (stub,):`` (it is stopped again between leases).  Each test
must leave a shared stub as it found it (its jobs end or are deleted); a test of the process
itself (exit, crash, hang) starts its own stub, or ends a shared one with
``stub_pool.retire(NAME)``.
"""
from __future__ import annotations

import json
import subprocess
import sys

from stub_pool import StubConfig
from stubserver import free_port

T2V = "Wan-AI/Wan2.2-T2V-A14B-Diffusers"
I2V = "Wan-AI/Wan2.2-I2V-A14B-Diffusers"
TI2V = "Wan-AI/Wan2.2-TI2V-5B-Diffusers"
KEY = "stub-shared-key-5f1e9c"   # VLLM_API_KEY of T2V_KEYED
OFFLOAD_FLAGS = "--enable-cpu-offload,--enable-layerwise-offload"

T2V_KEYED = "t2v_keyed"   # keyed; slow steps (0.05 s), one job at a time: a second job stays queued;
                          # 2 GPUs, Ulysses 2: the launcher's printed argv (printed_t2v_launch), run as is
I2V_SPLIT = "i2v"         # stdout (log lines) and stderr (progress bars) in separate files
TI2V_OFFLOAD = "ti2v"     # module offload on, and the stub would OOM at load without it


def printed_t2v_launch(port: int) -> dict:
    """What the launcher's ``argv --json`` prints for a 2-GPU Ulysses T2V server on ``port``
    (``{"argv": ["vllm", "serve", ...], "env": {..., "VLLM_API_KEY": "***"}, ...}``)."""
    out = subprocess.run([sys.executable, "-m", "vllm_omni_launcher", "argv", "--model", T2V, "--gpus", "0,1",
                          "--parallel", "ulysses=2", "--port", str(port), "--json"],
                         capture_output=True, text=True, check=True, timeout=300)
    return json.loads(out.stdout)


def _t2v_keyed_env(printed_env: dict) -> dict:
    """T2V_KEYED's environment: the printed one with the key the launcher would put in place of
    ``***``, and the stub's step time."""
    return {**printed_env, "VLLM_API_KEY": KEY, "VLLM_OMNI_STUB_STEP_S": "0.05"}


def _t2v_keyed() -> StubConfig:
    """T2V_KEYED runs exactly the printed argv (on a port free when it starts); test_argv_runs.py
    checks that, and that the server it makes serves the model behind the key."""
    shown = printed_t2v_launch(free_port())
    return StubConfig.from_argv(shown["argv"], env=_t2v_keyed_env(shown["env"]))


CONFIGS = {
    T2V_KEYED: _t2v_keyed,
    I2V_SPLIT: StubConfig(I2V, env={"VLLM_OMNI_STUB_STEP_S": "0.01"}, separate_stderr=True),
    TI2V_OFFLOAD: StubConfig(TI2V, flags=("--enable-cpu-offload",),
                             env={"VLLM_OMNI_STUB_OOM_UNLESS": OFFLOAD_FLAGS, "VLLM_OMNI_STUB_STEP_S": "0.01"}),
}
