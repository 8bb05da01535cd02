"""The size options `plan` and `argv` share (--gpu-memory), and the checked number types of plan's others.

Each is checked by argparse itself, so a bad value is a usage error (exit 2) that names the
option: NaN, infinity, 0, negative numbers and sizes no machine has are refused instead of
being planned for (NaN compares false with everything, so an unchecked `nan` "fits" anywhere).
"""
from __future__ import annotations

import argparse
import math
from typing import Any, Callable

from ..planner.gpus import parse_gpu_memory

# More host RAM than one machine holds (the largest single servers hold 32 TiB).
MAX_HOST_RAM_GIB = 65536.0
# More requests run together than any --max-num-seqs a video server takes (Wan batches a few).
MAX_BATCH = 64


def add_gpu_memory_option(group: Any, *, note: str = "") -> None:
    """--gpu-memory: plan for GPUs of these sizes (GiB) instead of this machine's."""
    group.add_argument("--gpu-memory", type=_gpu_sizes, default=None, metavar="GIB,GIB",
                       help="plan for GPUs of these sizes in GiB instead of this machine's (e.g. 24,24 or 80 or "
                            "2x141; a card sold as 24 GB holds about 24 GiB)" + (f"; {note}" if note else ""))


def _gpu_sizes(text: str) -> list[float]:
    try:
        return parse_gpu_memory(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def gib_amount(limit: float) -> Callable[[str], float]:
    """An argparse type: a finite number of GiB above 0 and at most `limit`."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and 0 < value <= limit):
            raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a size: write a number of GiB above 0 and at "
                                             f"most {limit:g}, e.g. 256")
        return value
    return parse


def whole_number(low: int, high: int) -> Callable[[str], int]:
    """An argparse type: a whole number from `low` to `high`."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = low - 1
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{text[:40]!r} is not valid: write a whole number from {low} to {high}")
        return value
    return parse
