"""Frame pattern shared by the stub engine and the tests that check decoded frames.

The stub server cannot run Wan2.2, so each frame it returns carries its own identity:
the frame index and the job's seed, written as bits in large flat blocks that survive
H.264 yuv420p compression. Tests decode a clip and read the bits back, which proves the
frame count, their order and the per-frame content end to end, within codec tolerance.

Only numpy is needed: this module runs in both the server and the ComfyUI environment.
"""
from __future__ import annotations

import numpy as np

BITS = 8            # bits per row: frame index mod 256, seed mod 256
ROWS = 2            # row 0: frame index, row 1: seed
HIGH, LOW = 224, 32  # block levels for a 1 bit and a 0 bit


def encode(index: int, seed: int, width: int, height: int) -> np.ndarray:
    """One RGB uint8 frame [H, W, 3] encoding `index` and `seed` (each mod 256)."""
    frame = np.empty((height, width, 3), dtype=np.uint8)
    for row, value in enumerate((index % 256, seed % 256)):
        y0, y1 = row * height // ROWS, (row + 1) * height // ROWS
        for bit in range(BITS):
            x0, x1 = bit * width // BITS, (bit + 1) * width // BITS
            on = (value >> (BITS - 1 - bit)) & 1
            frame[y0:y1, x0:x1] = HIGH if on else LOW
    return frame


def decode(frame: np.ndarray) -> tuple[int, int]:
    """Read (index mod 256, seed mod 256) back from a decoded frame.

    Accepts uint8 0..255 or float 0..1, layout [H, W, C]. Samples the centre of each
    block, away from the block edges where the codec blurs.
    """
    arr = np.asarray(frame)
    scale = 255.0 if arr.dtype.kind == "f" else 1.0
    height, width = arr.shape[:2]
    values = []
    for row in range(ROWS):
        cy = (2 * row + 1) * height // (2 * ROWS)
        value = 0
        for bit in range(BITS):
            cx = (2 * bit + 1) * width // (2 * BITS)
            level = float(arr[cy, cx].mean()) * scale
            value = (value << 1) | (1 if level > (HIGH + LOW) / 2 else 0)
        values.append(value)
    return values[0], values[1]
