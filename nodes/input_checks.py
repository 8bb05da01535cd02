"""Every value a workflow gives a node is checked against the node's own declaration first.

ComfyUI's /prompt converts and range-checks an API workflow's literal values only in part:
float("nan") (or the string "nan") passes a FLOAT's min/max, since every comparison with NaN is
false; a BOOLEAN takes bool() of anything; an input of a custom type (our server handle, model,
serving config) or IMAGE takes any literal; and a value linked from another node's output is not
checked at all. A node run with such a value would send "nan" to the server or fail with a raw
TypeError deep in the launcher. So each node's function is wrapped once, where the package
registers its nodes (`guard`), by one check derived from its INPUT_TYPES: the same declaration
that makes the widget decides what the node accepts.

What a value must be: INT a whole number (an integral float is taken as its int) within the
widget's min/max; FLOAT a finite number within them; STRING text; BOOLEAN true or false; a
combo a string among its list's entries (the list as the node declares it now; a node that names
in OWN_CHOICE_CHECKS the lists of this machine's files it checks itself, with a message saying
where entries come from, gets any string there); a custom type the
launcher's own value of that type; IMAGE an image tensor [B, H, W, C]. None is "not connected"
for an optional linked input and refused elsewhere. A value that does not fit raises the
launcher's LauncherError (node, input, what it got, what is allowed) before the node runs, so
nothing is sent and nothing is allocated.
"""
from __future__ import annotations

import functools
import inspect
import math
import numbers
from typing import Any, Collection, Optional

from ..errors import LauncherError
from ..server.config_values import shown
from .handles import MODEL_TYPE, SERVER_TYPE, SERVING_TYPE, ModelChoice, ServerHandle, ServingChoice

# The launcher's own link types: the class a value must be, and the node that makes it.
LINK_TYPES: dict[str, tuple[type, str]] = {
    SERVER_TYPE: (ServerHandle, "a server handle from Local Server or Remote Server"),
    MODEL_TYPE: (ModelChoice, "a model from Load Wan2.2 Model (or a LoRA node)"),
    SERVING_TYPE: (ServingChoice, "a serving configuration from Serving Config"),
}
SHOWN_CHOICES = 12          # a longer combo list is described by its length


def guard(cls: type, display_name: str) -> type:
    """Wrap node class `cls`'s FUNCTION with `check_inputs` (once); returns `cls`."""
    name = getattr(cls, "FUNCTION")
    func = getattr(cls, name)
    if getattr(func, "__checked_inputs__", False):
        return cls
    signature = inspect.signature(func)

    @functools.wraps(func)
    def checked(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            bound = signature.bind_partial(self, *args, **kwargs)
        except TypeError as exc:
            raise LauncherError(f"{display_name} was given inputs it does not have", str(exc),
                                "remove the extra values from the workflow's node") from None
        values: dict[str, Any] = {}
        for param, value in list(bound.arguments.items())[1:]:
            if signature.parameters[param].kind is inspect.Parameter.VAR_KEYWORD:
                values.update(value)
            else:
                values[param] = value
        clean = check_inputs(display_name, cls.INPUT_TYPES(), values, _defaults(signature),
                             getattr(cls, "OWN_CHOICE_CHECKS", ()))
        return func(self, **clean)

    checked.__checked_inputs__ = True  # type: ignore[attr-defined]
    setattr(cls, name, checked)
    return cls


def _defaults(signature: inspect.Signature) -> set[str]:
    """The parameters that may be left out (they have a default)."""
    return {p.name for p in signature.parameters.values() if p.default is not inspect.Parameter.empty}


def check_inputs(node: str, declared: dict[str, Any], values: dict[str, Any],
                 optional_params: Collection[str] = (), own_choices: Collection[str] = ()) -> dict[str, Any]:
    """`values` checked against the node's INPUT_TYPES `declared`, converted where the declaration
    says how (an integral float for an INT); raises LauncherError naming the node and the input.
    `optional_params`: inputs the function has a default for; `own_choices`: combos whose entries
    the node checks itself (only their type is checked here)."""
    required = declared.get("required", {})
    optional = declared.get("optional", {})
    hidden = declared.get("hidden", {})
    out: dict[str, Any] = {}
    for name, value in values.items():
        if name in hidden:
            out[name] = value
        elif name in required or name in optional:
            out[name] = _checked(node, name, required.get(name) or optional[name], value, name in optional,
                                 name in own_choices)
        else:
            raise LauncherError(f"{node} has no input '{name}'",
                                f"its inputs are {', '.join([*required, *optional])}",
                                f"remove '{name}' from the workflow's node", setting=name)
    missing = [name for name in required if name not in values and name not in optional_params]
    if missing:
        raise LauncherError(f"{node}: the required input '{missing[0]}' is missing",
                            "the workflow does not give it a value or a link",
                            f"connect or set '{missing[0]}'", setting=missing[0])
    return out


def _checked(node: str, name: str, spec: Any, value: Any, is_optional: bool, own_choice: bool) -> Any:
    kind, opts = spec[0], (spec[1] if len(spec) > 1 and isinstance(spec[1], dict) else {})

    def refuse(allowed: str) -> LauncherError:
        return LauncherError(
            f"{node}: input '{name}' got {_described(value)}", f"'{name}' takes {allowed}",
            f"set '{name}' to {allowed} (a workflow, or the node linked to it, gave another value)", setting=name)

    if isinstance(kind, (list, tuple)):                   # a combo: one of its entries
        if isinstance(value, str) and (own_choice or value in kind):
            return value
        raise refuse(_choices(list(kind)))
    if kind in ("INT", "FLOAT"):
        number = _number(value, whole=kind == "INT")
        lo, hi = opts.get("min"), opts.get("max")
        allowed = ("a whole number" if kind == "INT" else "a finite number") + _range(lo, hi)
        if number is None or (lo is not None and number < lo) or (hi is not None and number > hi):
            raise refuse(allowed)
        return number
    if kind == "STRING":
        if isinstance(value, str):
            return value
        raise refuse("text")
    if kind == "BOOLEAN":
        if isinstance(value, bool):
            return value
        raise refuse("true or false")
    if value is None and is_optional:
        return None                                       # an optional link left unconnected
    if kind in LINK_TYPES:
        cls, what = LINK_TYPES[kind]
        if isinstance(value, cls):
            return value
        raise refuse(what)
    if kind == "IMAGE":
        shape = getattr(value, "shape", None)
        if shape is not None and len(shape) == 4 and all(int(n) > 0 for n in shape) and int(shape[-1]) in (3, 4):
            return value
        raise refuse("an IMAGE [batch, height, width, 3] from an image node (e.g. Load Image)")
    return value                                          # a type this module does not know: the node checks it


def _number(value: Any, whole: bool) -> Optional[Any]:
    """`value` as the number it is (an int for `whole`), or None: bools, strings, NaN and inf are not numbers."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None
    if isinstance(value, numbers.Integral):               # numpy's integers too
        return int(value) if whole else float(value)
    value = float(value)
    if not math.isfinite(value):
        return None
    if whole:
        return int(value) if value.is_integer() else None
    return value


def _range(lo: Any, hi: Any) -> str:
    def text(n: Any) -> str:
        return str(n) if isinstance(n, int) else f"{n:g}"
    if lo is not None and hi is not None:
        return f" from {text(lo)} to {text(hi)}"
    if lo is not None:
        return f" of at least {text(lo)}"
    return f" of at most {text(hi)}" if hi is not None else ""


def _choices(options: list[Any]) -> str:
    if not options:
        return "an entry of its list (the list is empty on this machine)"
    if len(options) > SHOWN_CHOICES:
        return f"one of the {len(options)} entries of its list"
    return "one of: " + ", ".join(str(o) for o in options)


def _described(value: Any) -> str:
    if isinstance(value, float) and not math.isfinite(value):
        return f"the number {value}"
    if isinstance(value, (str, bool, int, float, list)) or value is None:
        return shown(value)
    return f"a value of type {type(value).__name__}"


__all__ = ["LINK_TYPES", "check_inputs", "guard"]
