"""Media for the VACE / speech-to-video / step-distilled tests: frames that compress like footage, a
portrait PNG for S2V, and the refusal a call raises (tests/unit/test_pipeline_*.py and
test_vace_s2v_distilled_requests.py)."""
from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pytest

from vllm_omni_launcher.client.images import image_to_png
from vllm_omni_launcher.errors import LauncherError


def smooth_frames(frames: int, height: int, width: int) -> np.ndarray:
    """A moving gradient (compresses like footage, unlike noise)."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    return np.stack([np.stack([(x + 4 * i) % width / width, y / height, np.full_like(x, i / max(1, frames))], -1)
                     for i in range(frames)])


def portrait(width: int = 832, height: int = 448) -> np.ndarray:
    """A start image for S2V (float [H, W, 3], as a ComfyUI IMAGE's one picture)."""
    return smooth_frames(1, height, width)[0]


def portrait_png(width: int = 832, height: int = 448) -> bytes:
    return image_to_png(portrait(width, height))


def refused(call: Callable[[], Any]) -> LauncherError:
    """The LauncherError `call` raises (the test fails when it raises none)."""
    with pytest.raises(LauncherError) as info:
        call()
    return info.value
