"""The stub server's fault knobs, read once from ``VLLM_OMNI_STUB_*`` at start.

Split out of ``stub_vllm_serve.py`` (the entry point; its docstring lists every knob) so the
fake GPU and the fault triggers read one frozen copy.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name, "")
    return float(raw) if raw.strip() else default


def _env_int(name: str) -> int | None:
    raw = os.environ.get(name, "").strip()
    return int(raw) if raw else None


@dataclass(frozen=True)
class Knobs:
    load_delay_s: float
    step_s: float
    oom_at_load: bool
    oom_unless: tuple[str, ...]
    oom_in_job: int | None
    crash_after_jobs: int | None
    hang_after_jobs: int | None
    hang_in_job: bool
    fault_grace_s: float

    @classmethod
    def from_env(cls) -> "Knobs":
        unless = tuple(f.strip() for f in os.environ.get("VLLM_OMNI_STUB_OOM_UNLESS", "").split(",") if f.strip())
        return cls(
            load_delay_s=_env_float("VLLM_OMNI_STUB_LOAD_DELAY_S", 0.0),
            step_s=_env_float("VLLM_OMNI_STUB_STEP_S", 0.02),
            oom_at_load=os.environ.get("VLLM_OMNI_STUB_OOM_AT_LOAD", "").strip() not in ("", "0"),
            oom_unless=unless,
            oom_in_job=_env_int("VLLM_OMNI_STUB_OOM_IN_JOB"),
            crash_after_jobs=_env_int("VLLM_OMNI_STUB_CRASH_AFTER_JOBS"),
            hang_after_jobs=_env_int("VLLM_OMNI_STUB_HANG_AFTER_JOBS"),
            hang_in_job=os.environ.get("VLLM_OMNI_STUB_HANG_IN_JOB", "").strip() not in ("", "0"),
            fault_grace_s=_env_float("VLLM_OMNI_STUB_FAULT_GRACE_S", 1.0),
        )

    def oom_at_load_now(self, argv: list[str]) -> bool:
        if self.oom_at_load:
            return True
        if not self.oom_unless:
            return False
        present = {arg.split("=", 1)[0] for arg in argv}
        return not any(flag in present for flag in self.oom_unless)


KNOBS = Knobs.from_env()
ARGV = sys.argv[1:]
