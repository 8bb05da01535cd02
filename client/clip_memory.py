"""How much memory one clip's frames may take: the machine's operator decides, never a workflow.

A decoded clip is ComfyUI's IMAGE, float32 RGB: 12 bytes per pixel per frame. Generate Video's
widgets allow 4096x4096x1025 (192 GiB), and a workflow is a stranger's JSON, so its widgets must
not choose how much we allocate: a hostile server answering a 1024x1024x1025 request with a tiny
black MP4 would otherwise make the launcher allocate 12 GiB. So every request whose frames will
be decoded is checked here, before it is submitted (VideoClient.clip_bounds, for single jobs and
every clip of a batch): the most its ClipBounds allow (bounds.py: the largest size and frame count
an honest server may return, frame interpolation included) times 12 bytes must fit the local
config's `max_clip_memory_gib`. Every allocation of frames (the IMAGE array, its prepared pages,
a batch's rows) is sized from those checked bounds, so none can pass the cap.

The default is a quarter of this machine's RAM (psutil): TI2V-5B's 1280x704x121 clip is 1.2 GiB,
A14B's 1280x720x81 is 0.8 GiB, so even a 16 GiB machine takes every model's default clip, while a
clip that would push ComfyUI into swap (or the OOM killer) is refused with the setting to raise.
"""
from __future__ import annotations

from typing import Optional

from ..errors import LauncherError
from ..errors.config_names import CONFIG_FILE_NAME, ENV_PREFIX
from .bounds import ClipBounds

SETTING = "max_clip_memory_gib"                 # LocalConfig's field (server/config/local_config.py declares it)
ENV_VAR = ENV_PREFIX + SETTING.upper()          # the local config's rule for a setting's variable
BYTES_PER_PIXEL = 3 * 4          # float32 RGB, ComfyUI's IMAGE
RAM_SHARE = 0.25                 # the default: this share of the machine's RAM
UNKNOWN_RAM_BYTES = 16 << 30     # RAM as assumed when it cannot be read
GIB = 1 << 30


def machine_ram_bytes() -> int:
    """This machine's physical RAM (psutil), or UNKNOWN_RAM_BYTES when it cannot be read."""
    try:
        import psutil  # noqa: PLC0415 (a requirement; lazy so importing the client stays light)

        return int(psutil.virtual_memory().total) or UNKNOWN_RAM_BYTES
    except Exception:  # noqa: BLE001 - a sandbox without /proc: the assumption is stated in the message
        return UNKNOWN_RAM_BYTES


def default_cap_gib() -> float:
    """The cap when the local config sets none: RAM_SHARE of this machine's RAM, in GiB."""
    return machine_ram_bytes() * RAM_SHARE / GIB


def cap_bytes(cap_gib: Optional[float]) -> int:
    """The per-clip cap in bytes: `cap_gib` (the setting), else the machine's default."""
    return int((default_cap_gib() if cap_gib is None else float(cap_gib)) * GIB)


def clip_bytes(bounds: ClipBounds) -> int:
    """The most memory the frames of a clip within `bounds` take as an IMAGE array."""
    return bounds.max_area * bounds.max_frames * BYTES_PER_PIXEL


def check_clip_memory(bounds: ClipBounds, cap_gib: Optional[float]) -> ClipBounds:
    """`bounds`, after refusing (LauncherError naming the setting) a clip whose frames could take
    more than the per-clip cap; nothing is allocated or sent before this."""
    need, cap = clip_bytes(bounds), cap_bytes(cap_gib)
    if need <= cap:
        return bounds
    where = ("set in the launcher's local config" if cap_gib is not None else
             f"the default, a quarter of this machine's {machine_ram_bytes() / GIB:.0f} GiB of RAM")
    return _refuse(bounds, need, cap, where)


def _refuse(bounds: ClipBounds, need: int, cap: int, where: str) -> ClipBounds:
    raise LauncherError(
        f"A {bounds.asked} clip needs {need / GIB:.1f} GiB of memory; this machine allows {cap / GIB:.1f} GiB "
        "per clip",
        f"its frames are held as ComfyUI's IMAGE (float32 RGB, {BYTES_PER_PIXEL} bytes per pixel per frame), and "
        f"how much one clip may take is the machine operator's choice, not a workflow's: {SETTING} = "
        f"{cap / GIB:.1f} GiB ({where}). Nothing was sent to the server",
        f"lower width, height or frames (or turn frame interpolation off), or raise {SETTING} in "
        f"{CONFIG_FILE_NAME} (or {ENV_VAR}) on this machine", setting="frames")


__all__ = ["BYTES_PER_PIXEL", "SETTING", "cap_bytes", "check_clip_memory", "clip_bytes", "default_cap_gib",
           "machine_ram_bytes"]
