"""VLLM_OMNI_LAUNCHER_GPU_MEMORY_GB: the GPU sizes to plan and launch for where NVML cannot see the GPUs.

The one reader of that variable: launches (planner/launch_plan.py), `plan` and the doctor all
take the sizes from here, so the sizes the no-GPU refusal tells users to set are the sizes
every surface plans with, and each says where they came from (`sizes_source`).
"""
from __future__ import annotations

import os
from typing import Optional, Sequence

from ..errors import LauncherError
from .gpus import parse_gpu_memory

GPU_MEMORY_ENV = "VLLM_OMNI_LAUNCHER_GPU_MEMORY_GB"


def env_gpu_memory() -> Optional[list[float]]:
    """The GPU sizes (GiB) the variable gives, None where it is unset or empty; a value that is not
    a list of sizes is refused, naming the variable."""
    text = os.environ.get(GPU_MEMORY_ENV)
    if not text:
        return None
    try:
        return parse_gpu_memory(text)
    except ValueError as exc:
        raise LauncherError(f"{GPU_MEMORY_ENV} is not valid", str(exc),
                            f"set {GPU_MEMORY_ENV} to this machine's GPU sizes in GiB (e.g. 80 or 24,24), or unset "
                            "it to ask NVML", setting=GPU_MEMORY_ENV) from None


def sizes_source(sizes: Sequence[float]) -> str:
    """How a plan names sizes that came from the variable."""
    return f"GPU memory from {GPU_MEMORY_ENV}={','.join(f'{s:g}' for s in sizes)}"
