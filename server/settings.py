"""Settings declared once: a dataclass field carries its type, its options, its default and its help.

Like vLLM's `engine/arg_utils.py`, the launch spec's dataclasses are the single declaration of
each setting: option sets are `Literal` types, defaults are the field defaults, and the help text
lives in the field's metadata. The CLI generates its options from `settings_of(LaunchSpec)` and
other surfaces (node inputs and their tooltips) can read the same records, so a new option or a
changed default is written in one place.
"""
from __future__ import annotations

import dataclasses
import types
from dataclasses import MISSING, dataclass
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints


def setting(default: Any = MISSING, help: str = "") -> Any:  # noqa: A002 (argparse's word)
    """A dataclass field that declares a setting: its default and the help text every surface shows."""
    if not help:
        raise TypeError("a setting needs its help text")
    return dataclasses.field(default=default, metadata={"help": help})


def options(literal: Any) -> tuple[str, ...]:
    """The values of a `Literal[...]` option set, in declaration order."""
    return tuple(get_args(literal))


@dataclass(frozen=True)
class Setting:
    """One setting of a (possibly nested) dataclass, as read from its field declaration."""

    path: tuple[str, ...]       # e.g. ("parallel", "mode") inside LaunchSpec
    type: type                  # bool, int, float, str, or the container type (tuple) for composite values
    choices: tuple[str, ...]    # the Literal's options; () when the value is free
    optional: bool              # None is allowed (means "decided later", e.g. a free port)
    default: Any                # dataclasses.MISSING when the setting is required
    help: str

    @property
    def name(self) -> str:
        return self.path[-1]

    @property
    def required(self) -> bool:
        return self.default is MISSING


def settings_of(cls: type, _prefix: tuple[str, ...] = ()) -> tuple[Setting, ...]:
    """Every setting of `cls` in declaration order, descending into nested config dataclasses.

    A field that is neither a nested dataclass nor declared with `setting()` is a bug: the
    declaration would be incomplete, so this raises instead of silently leaving it out.
    """
    hints = get_type_hints(cls)
    out: list[Setting] = []
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        if dataclasses.is_dataclass(hint):
            out.extend(settings_of(hint, _prefix + (f.name,)))
            continue
        if "help" not in f.metadata:
            raise TypeError(f"{cls.__name__}.{f.name} is not declared with setting(default, help)")
        inner, optional = _strip_optional(hint)
        choices = options(inner) if get_origin(inner) is Literal else ()
        kind = str if choices else (get_origin(inner) or inner)
        out.append(Setting(_prefix + (f.name,), kind, choices, optional, f.default, f.metadata["help"]))
    return tuple(out)


def _strip_optional(hint: Any) -> tuple[Any, bool]:
    if get_origin(hint) in (Union, types.UnionType):
        args = [a for a in get_args(hint) if a is not type(None)]
        if len(args) == 1:
            return args[0], len(args) != len(get_args(hint))
    return hint, False
