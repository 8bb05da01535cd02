"""What a vLLM-Omni answer to one request may look like: the clip's size, frame count and bytes.

The server's MP4 is untrusted input: a 52 KB H.264 file can claim 4096x4096 x 60 frames, which
is 11 GiB once decoded to float32. So before a byte is downloaded or a frame decoded, the
request fixes what may come back, allowing only what upstream legitimately changes:

* width / height: as sent, or floored to a multiple of 16 (A14B) or 32 (TI2V-5B: VAE x16 and
  patch 2); `pipeline_wan2_2.py` floors them silently. Not sent: upstream picks 832x480 (T2V),
  or a size of the image's aspect at an area of 480*832 (I2V) or 1280*720 (TI2V), so only the
  area is bounded then (1280*720 plus 10% for rounding).
* frames: upstream rounds a count that is not 4k+1 to n//4*4+1, so either the nearest 4k+1 at
  or below the request or the one above; with frame interpolation the caller names the factor
  (`frame_multiplier`), and (F-1)*m+1 .. F*m frames are allowed.
* bytes: at most BITS_PER_PIXEL bits per pixel per frame plus 1 MiB of container. Measured with
  PyAV's libx264 on pure noise (the worst case, and what random-weight test models produce):
  vLLM-Omni's own settings (preset ultrafast, default CRF) give 5-6 bits per pixel, lossless
  (crf 0, reachable through extra_params' video_codec_options) 12-15; real footage at the
  default CRF is well under 1. So 16 can never reject a real clip, and still stops an 800 MiB
  body for a 9-frame 256x256 request at 2.2 MiB.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional, Union

from ..errors import LauncherError

BITS_PER_PIXEL = 16
CONTAINER_BYTES = 1 << 20
SIZE_STEPS = (16, 32)
UNSENT_SIZE_AREA = int(1280 * 720 * 1.1)
_SIZE_FIELD = re.compile(r"^(\d+)x(\d+)$")


@dataclass(frozen=True)
class ClipBounds:
    """The widths, heights (None: not sent, only `max_area` applies) and frame counts that an
    honest server may return for one request; `asked` describes the request for messages."""

    widths: Optional[frozenset[int]]
    heights: Optional[frozenset[int]]
    max_area: int
    min_frames: int
    max_frames: int
    asked: str

    @property
    def max_bytes(self) -> int:
        """The download cap: BITS_PER_PIXEL per pixel of the largest allowed clip, plus 1 MiB."""
        return self.max_area * self.max_frames * BITS_PER_PIXEL // 8 + CONTAINER_BYTES

    @property
    def cap_reason(self) -> str:
        """Why max_bytes is the cap, for the error a larger download gets."""
        return (f"a {self.asked} clip from vLLM-Omni is at most {self.max_bytes / (1 << 20):.1f} MiB "
                f"({BITS_PER_PIXEL} bits per pixel per frame + {CONTAINER_BYTES >> 20} MiB)")

    def check(self, width: int, height: int, frames: Optional[int] = None) -> None:
        """Raise LauncherError when a clip of width x height (x frames, when known) cannot be the
        answer to the request."""
        fits = (self.widths is None or width in self.widths) and (self.heights is None or height in self.heights)
        fits = fits and 0 < width * height <= self.max_area
        if not fits or (frames is not None and not self.min_frames <= frames <= self.max_frames):
            raise self.mismatch(width, height, frames)

    def mismatch(self, width: int, height: int, frames: Union[int, str, None]) -> LauncherError:
        """The refusal of a width x height x frames clip ("?" when the count is not known)."""
        got = f"{width}x{height}x{frames if frames is not None else '?'}"
        return LauncherError(
            f"The server's video does not match the request: got {got}, asked for {self.asked}",
            "vLLM-Omni returns the requested width x height (at most floored to a multiple of 16 or 32) "
            "and frame count (rounded to 4k+1); this clip is something else, so the server is misbehaving "
            "or is not vLLM-Omni. The launcher refused it before decoding, so it could not exhaust memory",
            "check which program answers at the server URL and its log (a request that turns on frame "
            "interpolation must pass its frame_multiplier to generate)",
            setting="server")


def expected_shape(bounds: ClipBounds) -> Optional[tuple[int, int, int]]:
    """(frames, height, width) of the one clip an honest server returns within `bounds`, when the
    request fixes it exactly: a single width and height (multiples of 32, which no model's
    flooring changes), a 4k+1 frame count and no frame interpolation (its range of counts is
    never one count). None otherwise: the server decides, and a wrong guess would cost a second
    clip's memory for a moment. Callers allocate a clip's frames from this before its download
    (api.py's PreparedOutput, batch.py's rows); decode_mp4 still checks the stream against it."""
    widths, heights = bounds.widths, bounds.heights
    if widths is None or heights is None or len(widths) != 1 or len(heights) != 1 \
            or bounds.min_frames != bounds.max_frames:
        return None
    (width,), (height,) = widths, heights
    return bounds.max_frames, height, width


def bounds_for(width: Optional[int], height: Optional[int], num_frames: int, extra: dict[str, str],
               frame_multiplier: int = 1) -> ClipBounds:
    """The ClipBounds of a request's shape. A `size` form field ("WxH") overrides width/height,
    as it does upstream."""
    found = _SIZE_FIELD.match(str(extra.get("size", "")).strip())
    if found:
        width, height = int(found.group(1)), int(found.group(2))
    widths, heights = _floored(width), _floored(height)
    area = max(widths) * max(heights) if widths and heights else UNSENT_SIZE_AREA
    frames = max(1, int(num_frames))
    below = (frames - 1) // 4 * 4 + 1
    above = below if below == frames else below + 4
    mult = max(1, int(frame_multiplier))
    asked = f"{width or '?'}x{height or '?'}x{frames}" + (f" (x{mult} interpolated)" if mult > 1 else "")
    return ClipBounds(widths, heights, area, (below - 1) * mult + 1, above * mult, asked)


def _floored(value: Optional[int]) -> Optional[frozenset[int]]:
    if value is None:
        return None
    return frozenset({int(value)} | {int(value) // step * step for step in SIZE_STEPS if int(value) >= step})
