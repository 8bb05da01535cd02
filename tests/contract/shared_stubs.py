"""The stub servers that contract tests share for a whole session (``stub_pool`` fixture).

A stub start costs a vLLM import (tens of seconds on a small CI box), so the plain
configurations that many tests drive with ordinary requests run once per session, in
``tests/contract/conftest.py``'s :class:`stubserver.StubPool`; a test takes one with
``with stub_pool.lease(NAME) as (stub,):`` (it is stopped again between leases).  Each test
must leave a shared stub as it found it (its jobs end or are deleted); a test of the process
itself (exit, crash, hang) starts its own stub, or ends a shared one with
``stub_pool.retire(NAME)``.
"""
from __future__ import annotations

from stubserver import StubConfig

T2V = "Wan-AI/Wan2.2-T2V-A14B-Diffusers"
I2V = "Wan-AI/Wan2.2-I2V-A14B-Diffusers"
TI2V = "Wan-AI/Wan2.2-TI2V-5B-Diffusers"
KEY = "stub-shared-key-5f1e9c"   # VLLM_API_KEY of T2V_KEYED
OFFLOAD_FLAGS = "--enable-cpu-offload,--enable-layerwise-offload"

T2V_KEYED = "t2v_keyed"   # keyed; slow steps (0.05 s), one job at a time: a second job stays queued
I2V_SPLIT = "i2v"         # stdout (log lines) and stderr (progress bars) in separate files
TI2V_OFFLOAD = "ti2v"     # module offload on, and the stub would OOM at load without it

CONFIGS = {
    T2V_KEYED: StubConfig(T2V, env={"VLLM_API_KEY": KEY, "VLLM_OMNI_STUB_STEP_S": "0.05"}),
    I2V_SPLIT: StubConfig(I2V, env={"VLLM_OMNI_STUB_STEP_S": "0.01"}, separate_stderr=True),
    TI2V_OFFLOAD: StubConfig(TI2V, flags=("--enable-cpu-offload",),
                             env={"VLLM_OMNI_STUB_OOM_UNLESS": OFFLOAD_FLAGS, "VLLM_OMNI_STUB_STEP_S": "0.01"}),
}
