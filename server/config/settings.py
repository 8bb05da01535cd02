"""Settings declared once: a dataclass field carries its type, its options, its default and its help.

Like vLLM's `engine/arg_utils.py`, a settings dataclass is the single declaration of each
setting: option sets are `Literal` types, defaults are the field defaults, and the help text
lives in the field's metadata. Every surface is derived from those records: the CLI options
(cli/launch_options.py, from the launch spec and the serving choice), the Serving Config
node's inputs and tooltips (nodes/schema.py), and the local config's environment
variables, validation and reference table (server/config/local_config.py). So a new option or a
changed default is written in one place, with `setting()`.

Surface-specific facts travel as extra keywords in the same declaration (a widget's min and
max, a config setting's environment variable name or check), read from `Setting.extra`.
"""
from __future__ import annotations

import copy
import dataclasses
import types
from dataclasses import MISSING, dataclass
from typing import Any, Literal, Mapping, Union, get_args, get_origin, get_type_hints


def setting(default: Any = MISSING, help: str = "", **extra: Any) -> Any:  # noqa: A002 (argparse's word)
    """A dataclass field that declares a setting: its default, the help text every surface shows,
    and surface-specific `extra` facts (e.g. min=1, max=8 for a widget). A dict or list default
    is copied for each instance."""
    if not help:
        raise TypeError("a setting needs its help text")
    meta = {"help": help, **extra}
    if isinstance(default, (dict, list)):
        return dataclasses.field(default_factory=lambda: copy.deepcopy(default), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def like(cls: type, name: str, *, note: str = "", **changes: Any) -> Any:
    """A field declared as `cls.name` is (same default, help and extras), with `changes` (e.g. another
    default, a widget's min and max) and a `note` added to the help: for a surface that offers a
    setting of another dataclass under its own name (Serving Config's `offload` is the launch
    spec's `memory.offload`), so the declaration is still one."""
    f = next(f for f in dataclasses.fields(cls) if f.name == name)
    meta = dict(f.metadata)
    help_text = meta.pop("help") + (f"; {note}" if note else "")
    return setting(changes.pop("default", f.default), help_text, **{**meta, **changes})


def options(literal: Any) -> tuple[str, ...]:
    """The values of a `Literal[...]` option set, in declaration order (nested Literals flattened)."""
    return tuple(get_args(literal))


@dataclass(frozen=True)
class Setting:
    """One setting of a (possibly nested) dataclass, as read from its field declaration."""

    path: tuple[str, ...]       # e.g. ("parallel", "mode") inside LaunchSpec
    type: type                  # bool, int, float, str, or the container type (tuple, dict) for composite values
    choices: tuple[str, ...]    # the Literal's options; () when the value is free
    optional: bool              # None is allowed (means "decided later", e.g. a free port)
    default: Any                # dataclasses.MISSING when the setting is required
    help: str
    hint: Any = None            # the full annotation, e.g. Optional[tuple[str, ...]] (for raw-value conversion)
    extra: Mapping[str, Any] = dataclasses.field(default_factory=dict)   # the declaration's other keywords

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
        default = f.default_factory() if f.default_factory is not MISSING else f.default
        extra = {k: v for k, v in f.metadata.items() if k != "help"}
        out.append(Setting(_prefix + (f.name,), kind, choices, optional, default, f.metadata["help"], hint, extra))
    return tuple(out)


def _strip_optional(hint: Any) -> tuple[Any, bool]:
    if get_origin(hint) in (Union, types.UnionType):
        args = [a for a in get_args(hint) if a is not type(None)]
        if len(args) == 1:
            return args[0], len(args) != len(get_args(hint))
    return hint, False
