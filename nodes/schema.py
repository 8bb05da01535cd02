"""Node declarations, and the one check of a workflow's values derived from them.

Each node is a `Node` (id, inputs, outputs, its one core call); v3.py makes ComfyUI's V3 class of it.
ComfyUI checks values only in part (NaN passes a FLOAT's min/max, a BOOLEAN takes bool() of anything, a
V3 COMBO is not compared with its list, custom-typed and IMAGE inputs take any literal, links nothing),
so `Node.validate` (validate_inputs, at /prompt) holds literal combo values to their lists, through the
node's own `choose` where it has one, and `Node.call` (execute) checks every value, linked ones too,
raising LauncherError (node, input, what it got, what is allowed) before anything is sent: INT a whole
number within min/max, FLOAT a finite one, STRING text, BOOLEAN a bool, a combo an entry (an
`own_choice` list of this machine's files: any string, the run says where entries come from), a link
type our own value of it, IMAGE / MASK / AUDIO ComfyUI's shapes of them; None is an optional link left
unconnected, and a missing optional widget takes its default (a workflow saved before it).
"""
from __future__ import annotations

import functools
import math
import numbers
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Optional, Union

from ..errors import LauncherError
from ..server.config.config_values import shown
from ..server.config.settings import Setting
from .handles import MODEL_TYPE, SERVER_TYPE, SERVING_TYPE, ModelChoice, ServerHandle, ServingChoice

CATEGORY = "vLLM-Omni"
WIDGETS = ("INT", "FLOAT", "STRING", "BOOLEAN", "COMBO")
# The launcher's own link types: the class a value must be, and the node that makes it.
LINK_TYPES: dict[str, tuple[type, str]] = {
    SERVER_TYPE: (ServerHandle, "a server handle from Local Server or Remote Server"),
    MODEL_TYPE: (ModelChoice, "a model from Load Wan2.2 Model (or a LoRA node)"),
    SERVING_TYPE: (ServingChoice, "a serving configuration from Serving Config"),
}
SHOWN_CHOICES = 12          # a longer combo list is described by its length
Options = Union[tuple, Callable[[], list]]


@dataclass(frozen=True)
class Input:
    """One input, in the node's order (saved workflows store widget values by position). `kind`: of
    WIDGETS, ComfyUI's IMAGE / MASK / AUDIO / VIDEO, or our link types; `options`: a COMBO's entries,
    or a function listing this machine's files anew each time ComfyUI asks; `opts`: min, max, step,
    multiline, control_after_generate; `choose`: an `own_choice` combo's own check of an entry."""

    name: str
    kind: str
    tooltip: str
    default: Any = None
    optional: bool = False
    options: Options = ()
    own_choice: bool = False
    choose: Optional[Callable[[str], Any]] = None
    opts: dict[str, Any] = field(default_factory=dict)

    def choices(self) -> list[Any]:
        return list(self.options() if callable(self.options) else self.options)


@dataclass(frozen=True)
class Output:
    kind: str
    name: str
    tooltip: str
    is_list: bool = False


@dataclass(frozen=True)
class Node:
    """A node: its schema and `run`, its one core call with the checked values (and the hidden
    `unique_id` / `prompt` it asks for); `fingerprint`: V3's fingerprint_inputs (folded into every
    downstream cache key); `shows_text`: its first output is also the history's ui.text."""

    node_id: str
    display_name: str
    description: str
    inputs: Callable[[], list[Input]]
    outputs: tuple[Output, ...]
    run: Callable[..., tuple]
    hidden: tuple[str, ...] = ("unique_id",)
    output_node: bool = False
    fingerprint: Optional[Callable[..., Any]] = None
    shows_text: bool = False

    def call(self, values: dict[str, Any], hidden: Optional[dict[str, Any]] = None) -> tuple:
        """Run the node on a workflow's values: checked first, then `run`."""
        extra = {name: (hidden or {}).get(name) for name in self.hidden}
        return tuple(self.run(**check_inputs(self.display_name, self.inputs(), values), **extra))

    def validate(self, values: dict[str, Any]) -> Union[bool, str]:
        """True, or our message for the first literal combo value that is not an entry. A value that
        is not text (a number, a list, an object) is refused before `choose` or the list sees it:
        ComfyUI would turn their TypeError into a traceback."""
        for spec in self.inputs():
            value = values.get(spec.name)
            if spec.kind != "COMBO" or value is None:
                continue                                  # not given, or linked (checked when it runs)
            try:
                if isinstance(value, str) and spec.choose is not None:
                    spec.choose(value)
                elif not isinstance(value, str) or value not in spec.choices():
                    raise _refusal(self.display_name, spec.name, value, _choices(spec.choices()))
            except LauncherError as err:
                return f"{err.what}: {err.why}; {err.fix}"
        return True


def check_inputs(node: str, declared: list[Input], values: dict[str, Any]) -> dict[str, Any]:
    """`values` checked against the node's inputs `declared` and converted where the declaration
    says how (an integral float for an INT); missing optional widgets get their default. Raises
    LauncherError naming the node and the input."""
    by_name = {spec.name: spec for spec in declared}
    unknown = [name for name in values if name not in by_name]
    if unknown:
        raise LauncherError(f"{node} has no input '{unknown[0]}'", f"its inputs are {', '.join(by_name)}",
                            f"remove '{unknown[0]}' from the workflow's node", setting=unknown[0])
    out: dict[str, Any] = {}
    for spec in declared:
        if spec.name in values:
            out[spec.name] = _checked(node, spec, values[spec.name])
        elif not spec.optional:
            raise LauncherError(f"{node}: the required input '{spec.name}' is missing",
                                "the workflow does not give it a value or a link",
                                f"connect or set '{spec.name}'", setting=spec.name)
        else:
            out[spec.name] = spec.default               # None for an optional link left unconnected
    return out


def _refusal(node: str, name: str, value: Any, allowed: str) -> LauncherError:
    return LauncherError(f"{node}: input '{name}' got {_described(value)}", f"'{name}' takes {allowed}",
                         f"set '{name}' to {allowed} (a workflow, or the node linked to it, gave another value)",
                         setting=name)


def _checked(node: str, spec: Input, value: Any) -> Any:
    kind, opts = spec.kind, spec.opts
    refuse = functools.partial(_refusal, node, spec.name, value)
    if kind == "COMBO":
        if isinstance(value, str) and (spec.own_choice or value in spec.choices()):
            return value
        raise refuse(_choices(spec.choices()))
    if kind in ("INT", "FLOAT"):
        number = _number(value, whole=kind == "INT")
        lo, hi = opts.get("min"), opts.get("max")
        allowed = ("a whole number" if kind == "INT" else "a finite number") + _range(lo, hi)
        if number is None or (lo is not None and number < lo) or (hi is not None and number > hi):
            raise refuse(allowed)
        return number
    if kind in ("STRING", "BOOLEAN"):
        if isinstance(value, str if kind == "STRING" else bool):
            return value
        raise refuse("text" if kind == "STRING" else "true or false")
    if value is None and spec.optional:
        return None                                       # an optional link left unconnected
    if kind in LINK_TYPES:
        cls, what = LINK_TYPES[kind]
        if isinstance(value, cls):
            return value
        raise refuse(what)
    if kind in MEDIA:
        if _media_ok(kind, value):
            return value
        raise refuse(MEDIA[kind])
    return value                                          # a type this module does not know: the node checks it


MEDIA = {"IMAGE": "an IMAGE [batch, height, width, 3] from an image node (e.g. Load Image)",
         "MASK": "a MASK [batch, height, width] from a mask node",
         "AUDIO": "an AUDIO (waveform [batch, channels, samples], sample_rate) from an audio node (e.g. Load Audio)"}


def _media_ok(kind: str, value: Any) -> bool:
    """ComfyUI's IMAGE [B, H, W, 3 or 4], MASK [B, H, W] or [H, W], AUDIO {waveform [B, C, T], sample_rate}."""
    if kind == "AUDIO":
        rate = value.get("sample_rate") if isinstance(value, dict) else None
        if not isinstance(rate, int) or isinstance(rate, bool) or rate <= 0:
            return False
        value = value.get("waveform")
    shape = getattr(value, "shape", None)
    dims = {"IMAGE": (4,), "MASK": (2, 3), "AUDIO": (3,)}[kind]
    return (shape is not None and len(shape) in dims and all(int(n) > 0 for n in shape)
            and (kind != "IMAGE" or int(shape[-1]) in (3, 4)))


def _number(value: Any, whole: bool) -> Optional[Any]:
    """`value` as the number it is (an int for `whole`), or None: bools, strings, NaN and inf are not numbers."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None
    try:
        if isinstance(value, numbers.Integral):           # numpy's integers too
            return int(value) if whole else float(value)
        value = float(value)
    except OverflowError:                                 # an int (or a Fraction) beyond a float's range
        return None
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


# ----------------------------------------------------------------------------- settings as widgets
# Widgets from the settings of a dataclass (server/config/settings.py): type from the field's (a
# Literal is a combo), default, tooltip from its help, min / max / step: a widget and its CLI option agree.
_WIDGET_TYPES = {bool: "BOOLEAN", int: "INT", float: "FLOAT", str: "STRING"}
_WIDGET_EXTRAS = ("min", "max", "step")


def setting_input(s: Setting) -> Input:
    """One node input for setting `s`; one declared `appended=True` (added after a release) is optional,
    so an API prompt saved before it still validates and the node uses the declared default."""
    if not s.choices and s.type not in _WIDGET_TYPES:
        raise TypeError(f"setting {s.name} of type {s.type} has no widget")
    return Input(s.name, "COMBO" if s.choices else _WIDGET_TYPES[s.type], s.help, default=s.default,
                 optional=bool(s.extra.get("appended")), options=tuple(s.choices),
                 opts={k: s.extra[k] for k in _WIDGET_EXTRAS if k in s.extra})


def setting_inputs(settings: Iterable[Setting]) -> list[Input]:
    """The inputs for `settings` in declaration order (a format: widget values are stored by
    position); appended ones must come last."""
    inputs = [setting_input(s) for s in settings]
    appended = [i for i in inputs if i.optional]
    if appended and inputs[-len(appended):] != appended:
        raise TypeError("appended settings must be declared after all the others")
    return inputs
