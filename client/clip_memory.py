"""How much memory one clip's frames may take: the machine's operator decides, never a workflow.

A decoded clip is ComfyUI's IMAGE, float32 RGB: 12 bytes per pixel per frame. Generate Video's
widgets allow 4096x4096x1025 (192 GiB), and a workflow is a stranger's JSON, so its widgets must
not choose how much we allocate: a hostile server answering a 1024x1024x1025 request with a tiny
black MP4 would otherwise make the launcher allocate 12 GiB. So every request whose frames will
be decoded is checked here, before it is submitted (VideoClient.clip_bounds, for single jobs and
every clip of a batch): the most its ClipBounds allow (bounds.py: the largest size and frame count
an honest server may return, frame interpolation included) times 12 bytes must fit the local
config's `max_clip_memory_gib`. A batch's clips are one IMAGE array, so their sum must fit it
too (check_batch_memory, before the first is submitted). Every allocation of frames (the IMAGE
array, its prepared pages, a batch's rows) is sized from those checked bounds, so none can pass
the cap.

The default is a quarter of this machine's RAM (psutil): TI2V-5B's 1280x704x121 clip is 1.2 GiB,
A14B's 1280x720x81 is 0.8 GiB, so even a 16 GiB machine takes every model's default clip, while a
clip that would push ComfyUI into swap (or the OOM killer) is refused with the setting to raise.
"""
from __future__ import annotations

from typing import Optional, Sequence

from ..errors import LauncherError
from ..errors.config_names import CONFIG_FILE_NAME, env_var
from .bounds import ClipBounds

SETTING = "max_clip_memory_gib"                 # LocalConfig's field (server/config/local_config.py declares it)
ENV_VAR = env_var(SETTING)                      # the setting's variable (declared without env=)
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
    raise _refusal(f"A {bounds.asked} clip needs {need / GIB:.1f} GiB of memory; this machine allows "
                   f"{cap / GIB:.1f} GiB per clip", "its frames are held", cap_gib, cap,
                   "lower width, height or frames (or turn frame interpolation off)", "frames")


def check_batch_memory(bounds: Sequence[ClipBounds], cap_gib: Optional[float]) -> None:
    """Refuse a batch with a clip past the cap (check_clip_memory's refusal), or whose clips' frames
    could take more than the same cap together: a batch's frames are one IMAGE array of all its
    clips (batch.py), so the cap bounds that array, not only each clip. Checked with the clips'
    bounds, before anything is allocated or sent."""
    for clip in bounds:
        check_clip_memory(clip, cap_gib)
    need, cap = sum(clip_bytes(b) for b in bounds), cap_bytes(cap_gib)
    if need <= cap:
        return
    asked = ", ".join(dict.fromkeys(b.asked for b in bounds))
    raise _refusal(f"{len(bounds)} clips of {asked} need {need / GIB:.1f} GiB of memory together; this machine "
                   f"allows {cap / GIB:.1f} GiB", "the batch's frames are one IMAGE array holding every clip, held",
                   cap_gib, cap, "lower batch_count or use fewer prompt lines, or lower width, height or frames",
                   "batch_count")


def _refusal(what: str, held: str, cap_gib: Optional[float], cap: int, lower: str, setting: str) -> LauncherError:
    """The cap's one wording: `held` says what holds the frames, `lower` what the workflow can change."""
    where = ("set in the launcher's local config" if cap_gib is not None else
             f"the default, a quarter of this machine's {machine_ram_bytes() / GIB:.0f} GiB of RAM")
    return LauncherError(
        what,
        f"{held} as ComfyUI's IMAGE (float32 RGB, {BYTES_PER_PIXEL} bytes per pixel per frame), and how much "
        f"memory they may take is the machine operator's choice, not a workflow's: {SETTING} = "
        f"{cap / GIB:.1f} GiB ({where}). Nothing was sent to the server",
        f"{lower}, or raise {SETTING} in {CONFIG_FILE_NAME} (or {ENV_VAR}) on this machine", setting=setting)


__all__ = ["BYTES_PER_PIXEL", "SETTING", "cap_bytes", "check_batch_memory", "check_clip_memory", "clip_bytes",
           "default_cap_gib", "machine_ram_bytes"]
