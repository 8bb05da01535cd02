"""The only place that touches ComfyUI at run time: progress, interrupt, status text, VIDEO, folders.

All imported lazily, with a fallback outside ComfyUI (CI, tests); the V3 parts from `PINNED` only.
Tests install a stand-in for these modules (tests/contract/comfy_standin.py).
"""
from __future__ import annotations

import asyncio
import contextlib
import importlib
import io
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any, NoReturn, Optional

import numpy as np


PINNED = "comfy_api.v0_0_2"   # ComfyUI's versioned node API the pack is written against (v3.py)
PROGRESS_WAIT_S = 5.0         # a busy server loop delays the bar, never the job


def set_progress(value: int, total: int, node_id: Optional[str]) -> None:
    """The node's bar via the V3 API's `ComfyAPI.Execution.set_progress` on ComfyUI's server loop (from
    the node's and supervisor's threads), waited for so none lands after the node ends; it never raises
    ComfyUI's interrupt. 0.3.64 never builds ComfyAPISync's `execution` (a PEP 563 string annotation)."""
    try:
        execution = importlib.import_module(PINNED).ComfyAPI.Execution()
        from server import PromptServer  # type: ignore[import-not-found]  # ComfyUI's, not ours
        loop = PromptServer.instance.loop
    except (ImportError, AttributeError):
        return
    if node_id:
        update = execution.set_progress(value, max(1, total), node_id=node_id)
        with contextlib.suppress(TimeoutError):
            asyncio.run_coroutine_threadsafe(update, loop).result(timeout=PROGRESS_WAIT_S)


def interrupted() -> bool:
    """Has the user pressed Cancel? Reads the flag without clearing it."""
    try:
        import comfy.model_management as mm  # type: ignore[import-not-found]
    except ImportError:
        return False
    return bool(mm.processing_interrupted())


def raise_interrupted() -> NoReturn:
    """End the node as 'interrupted' (not as an error), the way ComfyUI's own nodes do."""
    try:
        import comfy.model_management as mm  # type: ignore[import-not-found]
    except ImportError:
        raise KeyboardInterrupt("cancelled") from None
    mm.throw_exception_if_processing_interrupted()
    raise mm.InterruptProcessingException()


def send_status(text: str, node_id: Optional[str]) -> None:
    """Status text under the node (binary TEXT event); silently nothing outside ComfyUI."""
    if not node_id:
        return
    try:
        from server import PromptServer  # type: ignore[import-not-found]  # ComfyUI's, not ours
    except ImportError:
        return
    instance = getattr(PromptServer, "instance", None)
    if instance is not None and hasattr(instance, "send_progress_text"):
        instance.send_progress_text(text, node_id)


def to_image(frames: np.ndarray) -> Any:
    """[F,H,W,3] float32 0..1 numpy -> ComfyUI IMAGE (torch, zero-copy)."""
    import torch

    return torch.from_numpy(frames)


def first_image(image: Any) -> np.ndarray:
    """The first image of a ComfyUI IMAGE [B,H,W,C] as numpy [H,W,C] (client/images.py makes its PNG)."""
    array = image.detach().cpu().numpy() if hasattr(image, "detach") else np.asarray(image)
    return array[0] if array.ndim == 4 else array


@dataclass(repr=False)            # never the MP4 bytes in a printed input
class Mp4Video:
    """VIDEO stand-in outside ComfyUI: the server's MP4 bytes, untouched (lossless)."""

    data: bytes
    fps: float

    def save_to(self, path: Any, **_: Any) -> None:
        Path(path).write_bytes(self.data)

    def get_frame_rate(self) -> Fraction:
        return Fraction(self.fps).limit_denominator(1000)


def make_video(mp4: bytes, fps: float) -> Any:
    """ComfyUI VIDEO over the MP4 bytes (no re-encode), else our stand-in."""
    try:
        return importlib.import_module(PINNED).InputImpl.VideoFromFile(io.BytesIO(mp4))
    except (ImportError, AttributeError):
        return Mp4Video(mp4, fps)


def diffusers_folders() -> list[Path]:
    """ComfyUI's model folders that may hold Diffusers-format Wan2.2 repos."""
    return model_folders("diffusers", "diffusion_models")


def lora_folders() -> list[Path]:
    """ComfyUI's `loras` model folders (models/loras and extra_model_paths.yaml entries)."""
    return model_folders("loras")


def interpolation_models() -> dict[str, Path]:
    """RIFE folders (holding flownet.pkl) under ComfyUI's models/frame_interpolation, by relative name."""
    roots = model_folders("frame_interpolation")
    try:
        import folder_paths  # type: ignore[import-not-found]
        roots.append(Path(folder_paths.models_dir) / "frame_interpolation")
    except (ImportError, AttributeError):
        pass
    found: dict[str, Path] = {}
    for root in roots:
        for weights in sorted(root.rglob("flownet.pkl")) if root.is_dir() else ():
            name = weights.parent.relative_to(root).as_posix()
            found.setdefault(name if name != "." else root.name, weights.parent)
    return found


def register_user_directory() -> None:
    """Tell the core ComfyUI's user directory (the config file and data dir go there): the core never
    asks ComfyUI itself, so the command line run inside a ComfyUI checkout does not switch files."""
    from ..errors.config_names import use_comfy_user_dir

    try:
        import folder_paths  # type: ignore[import-not-found]
    except ImportError:
        return
    use_comfy_user_dir(folder_paths.get_user_directory())


def model_folders(*keys: str) -> list[Path]:
    """The existing folders ComfyUI registers under these model-folder keys."""
    try:
        import folder_paths  # type: ignore[import-not-found]
    except ImportError:
        return []
    roots: list[Path] = []
    for key in keys:
        try:
            roots += [Path(p) for p in folder_paths.get_folder_paths(key)]
        except (KeyError, AttributeError):
            continue
    return [r for r in roots if r.is_dir()]
