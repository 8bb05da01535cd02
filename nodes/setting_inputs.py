"""Node inputs derived from setting declarations (server/settings.py).

A node's widgets are the settings of one dataclass, in declaration order: the widget type
comes from the field's type (a `Literal` becomes a combo of its options), the default from the
field's default, the tooltip from its help, and `min` / `max` from the declaration's extras.
So a widget and the CLI option for the same setting cannot disagree.
"""
from __future__ import annotations

from typing import Any, Iterable

from ..server.settings import Setting

_WIDGET_TYPES = {bool: "BOOLEAN", int: "INT", float: "FLOAT", str: "STRING"}
_WIDGET_EXTRAS = ("min", "max", "step")


def widget(s: Setting) -> tuple[Any, dict[str, Any]]:
    """One ComfyUI input (type or combo options, options) for setting `s`."""
    opts: dict[str, Any] = {"default": s.default, "tooltip": s.help}
    opts.update({k: s.extra[k] for k in _WIDGET_EXTRAS if k in s.extra})
    if s.choices:
        return list(s.choices), opts
    if s.type not in _WIDGET_TYPES:
        raise TypeError(f"setting {s.name} of type {s.type} has no widget")
    return _WIDGET_TYPES[s.type], opts


def widgets(settings: Iterable[Setting]) -> dict[str, tuple[Any, dict[str, Any]]]:
    """The inputs for `settings`, by name, in their declaration order (saved workflows store widget
    values by position, so that order is part of the format)."""
    return {s.name: widget(s) for s in settings}


def node_inputs(settings: Iterable[Setting]) -> dict[str, dict[str, tuple[Any, dict[str, Any]]]]:
    """A node's INPUT_TYPES for `settings`: those declared `appended=True` (widgets added after a
    release) are optional inputs, so an API prompt saved before them still validates (ComfyUI
    refuses a prompt that lacks a required input) and the node uses the declared default; they
    come last, after the required ones, as the declaration order has them."""
    listed = list(settings)
    appended = [s for s in listed if s.extra.get("appended")]
    if appended and listed[-len(appended):] != appended:
        raise TypeError("appended settings must be declared after all the others")
    out = {"required": widgets(s for s in listed if not s.extra.get("appended"))}
    if appended:
        out["optional"] = widgets(appended)
    return out
