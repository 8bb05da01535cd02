"""The launch options shared by argv, serve, generate and plan, generated from the LaunchSpec fields.

Each option's type, choices, default and help come from `server/spec.py` (through
`settings_of(LaunchSpec)`); this module adds only what is the command line's own: flag names
that differ from the field, the syntax of the few composite values (`--gpus 0,1`,
`--parallel MODE=N`, repeatable `--extra-flag`), and defaults the local config decides.
"""
from __future__ import annotations

import argparse
from typing import Any

from ..server.settings import Setting, settings_of
from ..server.spec import LaunchSpec, parse_gpus, parse_parallel

SETTINGS: tuple[Setting, ...] = settings_of(LaunchSpec)
_BY_NAME = {s.name: s for s in SETTINGS}

# Placeholder shown for the port where none is configured: `argv` prints this instead of a
# random free port so that the printed argv is the same on every call.
PORT_PLACEHOLDER = 8091

# Settings whose command-line syntax is not one value of the field's type:
# first field -> (option, the fields it sets, argparse keywords, syntax note).
_COMPOSITE: dict[str, tuple[str, tuple[str, ...], dict[str, Any], str]] = {
    "gpus": ("--gpus", ("gpus",), {"metavar": "IDS", "default": "all"},
             "e.g. 0 or 0,1; all (the default) = unset"),
    "mode": ("--parallel", ("mode", "degree"), {"metavar": "MODE=N", "default": "none"},
             "MODE: none (the default) or one of those, e.g. ulysses=2; aliases tp, usp; a bare MODE means N=2"),
    "extra_flags": ("--extra-flag", ("extra_flags",),
                    {"metavar": "FLAG[=VALUE]", "action": "append", "default": [], "dest": "extra_flag"},
                    "e.g. --extra-flag=--max-num-seqs=2 (repeatable)"),
}
_COMPOSITE_FIELDS = {name for _, fields, _, _ in _COMPOSITE.values() for name in fields}
_FLAG_NAMES = {"vae_patch": "--vae-patch"}
_METAVARS: dict[type, str] = {int: "N", float: "X"}
# Defaults that are not the spec's: the local config decides them at run time.
_CONFIG_DEFAULTS = {
    "host": "default: the local config's, else 127.0.0.1",
    "port": f"default: the local config's; where none is set, `argv` shows {PORT_PLACEHOLDER}",
}


def add_launch_options(parser: argparse.ArgumentParser, *, model_required: bool = True) -> None:
    g = parser.add_argument_group("launch options")
    for s in SETTINGS:
        if s.name in _COMPOSITE:
            flag, fields, kwargs, note = _COMPOSITE[s.name]
            text = "; N: ".join(_BY_NAME[name].help for name in fields)
            g.add_argument(flag, help=f"{text}; {note}", **kwargs)
        elif s.name not in _COMPOSITE_FIELDS:
            _add_setting(g, s, required=model_required if s.name == "model" else s.required)


def _add_setting(group: argparse._ArgumentGroup, s: Setting, *, required: bool) -> None:
    flag = _FLAG_NAMES.get(s.name, "--" + s.name.replace("_", "-"))
    text = s.help
    if s.name in _CONFIG_DEFAULTS:
        text += f"; {_CONFIG_DEFAULTS[s.name]}"
        default = None
    else:
        default = None if s.required else s.default
        if s.choices:
            text += f" (default: {default})"
    if s.type is bool:
        group.add_argument(flag, dest=s.name, default=default,
                           action="store_true" if default is False else argparse.BooleanOptionalAction,
                           help=text)
        return
    metavar = None if s.choices else _METAVARS.get(s.type, s.name.rsplit("_", 1)[-1].upper())
    group.add_argument(flag, dest=s.name, type=s.type, choices=s.choices or None, default=default,
                       required=required, metavar=metavar, help=text)


def spec_from_args(args: argparse.Namespace, default_host: str = "127.0.0.1") -> LaunchSpec:
    """The LaunchSpec the parsed options describe (not yet validated: callers call `validate()`)."""
    mode, degree = parse_parallel(args.parallel)
    composite = {"gpus": parse_gpus(args.gpus), "mode": mode, "degree": degree,
                 "extra_flags": tuple(args.extra_flag), "host": args.host or default_host}
    data: dict[str, Any] = {}
    for s in SETTINGS:
        value = composite[s.name] if s.name in composite else getattr(args, s.name)
        target = data
        for part in s.path[:-1]:
            target = target.setdefault(part, {})
        target[s.name] = value
    return LaunchSpec.from_dict(data)
