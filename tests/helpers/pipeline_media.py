"""Media for the VACE / speech-to-video / step-distilled tests: frames that compress like footage, a
portrait PNG for S2V, the refusal a call raises, and a node job stopped where it would be sent
(tests/unit/test_pipeline_*.py, test_vace_*.py, test_reference_images_sent_at_request_size.py)."""
from __future__ import annotations

from typing import Any, Callable, Iterator

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


class Sent(Exception):
    """Raised where a node's job would go to the server (jobs_stopped_before_sending)."""


@pytest.fixture()
def jobs_stopped_before_sending(monkeypatch) -> Iterator[list[Any]]:
    """Every node job stopped where it would be sent (nodes.session._run raises Sent), its request recorded."""
    from vllm_omni_launcher.nodes import session

    requests: list[Any] = []

    def job(handle: Any, request: Any, reporter: Any) -> None:
        requests.append(request)
        raise Sent

    monkeypatch.setattr(session, "_run", job)
    yield requests
