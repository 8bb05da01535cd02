"""The request options `generate` and `plan` share, checked by one rule before anything is planned or started.

On the command line an option left out is the model's recommended value; a value given is used
as given. The Generate Video node's markers (0 for width, height, frames, fps and steps, -1 for
guidance and flow shift) mean "the model's value" only on the node, where a widget always has a
value: here `--frames -3` or `--width 0` is an error naming the option, in both commands,
instead of a silent default in one and a refusal in the other. The shape itself (multiples of
16 or 32, 4k+1 frames) is then checked by `models.check_request`, as for the node.
"""
from __future__ import annotations

import argparse
import math
from typing import Optional

from ..errors import LauncherError

# option -> (what it is, smallest allowed value, whether the smallest is allowed itself)
_BOUNDS: dict[str, tuple[str, float, bool]] = {
    "width": ("the frame width in pixels", 1, True),
    "height": ("the frame height in pixels", 1, True),
    "frames": ("the frame count (4k+1)", 1, True),
    "fps": ("frames per second", 0, False),
    "steps": ("the number of denoise steps", 1, True),
    "guidance": ("the guidance scale", 0, True),
    "guidance_2": ("the low-noise expert's guidance scale", 0, True),
    "flow_shift": ("the flow shift", 0, True),
    "boundary_ratio": ("the A14B expert boundary (0..1)", 0, True),
}
_EXAMPLES = {"width": "1280", "height": "704", "frames": "81", "fps": "24", "steps": "40", "guidance": "5",
             "guidance_2": "3", "flow_shift": "5", "boundary_ratio": "0.875"}


def check_request_options(args: argparse.Namespace) -> None:
    """Refuse a request option given with a value the command line does not take (see the module doc)."""
    for name, (what, low, inclusive) in _BOUNDS.items():
        value: Optional[float] = getattr(args, name, None)
        if value is None:
            continue
        flag = "--" + name.replace("_", "-")
        ok = math.isfinite(value) and (value >= low if inclusive else value > low)
        if name == "boundary_ratio":
            ok = ok and value <= 1
        if not ok:
            bound = f"at least {low:g}" if inclusive else f"above {low:g}"
            raise LauncherError(
                f"{flag} {value:g} is not valid", f"it is {what} and must be {bound}"
                + (" and at most 1" if name == "boundary_ratio" else "")
                + "; on the command line a value is used as given (the node's 0 / -1 markers do not apply)",
                f"write e.g. {flag} {_EXAMPLES[name]}, or leave {flag} out for the model's recommended value",
                setting=flag)
