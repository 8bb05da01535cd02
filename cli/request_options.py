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

from ..client.request_fields import REQUEST_FIELDS, SEED
from ..errors import LauncherError


def check_request_options(args: argparse.Namespace) -> None:
    """Refuse a request option given with a value the command line does not take (see the module doc):
    each field's range is client/request_fields.py's, as for the nodes' widgets and models.request_for."""
    for field in REQUEST_FIELDS.values():
        value: Optional[float] = getattr(args, field.name, None)
        if value is None:
            continue
        flag = "--" + field.name.replace("_", "-")
        broken = field.refusal(value) if math.isfinite(value) else \
            f"a finite number from {field.shown(field.low)} to {field.shown(field.high)}"
        if broken is None:
            continue
        left_out = "a random one" if field is SEED else "the model's recommended value"
        markers = "" if field is SEED else \
            "; on the command line a value is used as given (the node's 0 / -1 markers do not apply)"
        raise LauncherError(
            f"{flag} {field.shown(value)} is not valid", f"it is {field.what} and must be {broken}{markers}",
            f"write e.g. {flag} {field.example}, or leave {flag} out for {left_out}", setting=flag)
