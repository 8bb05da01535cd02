"""The launch options shared by argv, serve, generate and plan, generated from the settings' declarations.

Each option's type, choices, default and help come from `server/launch/spec.py` (through
`settings_of(LaunchSpec)`) and, for the serving choices the spec does not have (the OOM
fallback, keep-alive), from `ServingChoice` (planner/launch_plan.py), the declaration the
Serving Config node's widgets come from. This module adds only what is the command line's
own: flag names that differ from the field, the syntax of the few composite values (`--gpus
0,1|auto|count=N`, `--parallel MODE=N|auto`, repeatable `--extra-flag`), and defaults the
local config decides. `launch_from_args` hands the options to the core's `resolve_launch()`,
the same function the Local Server node uses.
"""
from __future__ import annotations

import argparse
from dataclasses import replace
from typing import Any, Optional

from ..planner.launch_plan import LaunchPlan, ServingChoice, resolve_launch
from ..server.config.local_config import LocalConfig
from ..server.config.settings import Setting, settings_of
from ..server.launch.flags import Version
from ..server.launch.loras import EXPERTS, startup_from_cli
from ..server.launch.spec import LaunchSpec, parse_gpus, parse_parallel

SETTINGS: tuple[Setting, ...] = settings_of(LaunchSpec)
_BY_NAME = {s.name: s for s in SETTINGS}
_SERVING = {s.name: s for s in settings_of(ServingChoice)}
AUTO = "auto"               # --parallel auto: the memory planner decides

# Placeholder shown for the port where none is configured: `argv` prints this instead of a
# random free port so that the printed argv is the same on every call.
PORT_PLACEHOLDER = 8091

# Settings whose command-line syntax is not one value of the field's type:
# first field -> (option, the fields it sets, argparse keywords, syntax note).
_COMPOSITE: dict[str, tuple[str, tuple[str, ...], dict[str, Any], str]] = {
    "gpus": ("--gpus", ("gpus",), {"metavar": "IDS", "default": "all"},
             "e.g. 0 or 0,1; all (the default) or auto = unset; count=N = the first N visible"),
    "mode": ("--parallel", ("mode", "degree"), {"metavar": "MODE=N", "default": "none"},
             "MODE: none, auto (the memory planner picks the fastest configuration that fits this machine's "
             "GPUs, as Serving Config's auto does) or one of those, e.g. ulysses=2; aliases tp, usp; a bare "
             "MODE means N=2"),
    "extra_flags": ("--extra-flag", ("extra_flags",),
                    {"metavar": "FLAG[=VALUE]", "action": "append", "default": [], "dest": "extra_flag"},
                    "e.g. --extra-flag=--max-num-seqs=2 (repeatable)"),
    "lora_paths": ("--lora", ("lora_paths",), {"metavar": "PATH[:STRENGTH]", "action": "append", "default": [],
                                               "dest": "lora"},
                   "a .safetensors file (vLLM-Omni 0.30), repeatable: for A14B the first is the high-noise and "
                   "the second the low-noise LoRA unless --lora-expert says otherwise, one alone applies to both; "
                   "fused at startup (a STRENGTH other than 1 fuses a scaled copy made in the data dir); PEFT "
                   "folders go to `generate --lora-request`"),
}
_COMPOSITE_FIELDS = {name for _, fields, _, _ in _COMPOSITE.values() for name in fields}
_FLAG_NAMES = {"vae_patch": "--vae-patch"}
_METAVARS: dict[type, str] = {int: "N", float: "X"}
# Defaults that are not the spec's: the local config decides them at run time.
_CONFIG_DEFAULTS = {
    "host": "default: the local config's, else 127.0.0.1",
    "port": f"default: the local config's; where none is set, `argv` shows {PORT_PLACEHOLDER}",
}


def add_launch_options(parser: argparse.ArgumentParser, *, model_required: bool = True,
                       parallel_default: str = "none", launching: bool = False) -> None:
    """The launch options; `launching` adds the ones that matter only when a server starts
    (the OOM fallback)."""
    g = parser.add_argument_group("launch options")
    for s in SETTINGS:
        if s.name in _COMPOSITE:
            flag, fields, kwargs, note = _COMPOSITE[s.name]
            text = "; N: ".join(_BY_NAME[name].help for name in fields)
            if s.name == "mode":
                kwargs = {**kwargs, "default": parallel_default}
                note += f" (default: {parallel_default})"
            g.add_argument(flag, help=_literal(f"{text}; {note}"), **kwargs)
            if s.name == "lora_paths":
                g.add_argument("--lora-expert", action="append", default=[], choices=EXPERTS,
                               help="the A14B expert of the --lora at the same position (repeatable)")
        elif s.name not in _COMPOSITE_FIELDS:
            _add_setting(g, s, required=model_required if s.name == "model" else s.required)
    add_serving_option(g, "speed", note="only with --parallel auto")
    if launching:
        add_serving_option(g, "auto_fallback", note="default: on; needs the GPU sizes (NVML, or "
                           "VLLM_OMNI_LAUNCHER_GPU_MEMORY_GB)")


def add_serving_option(group: Any, name: str, *, note: str = "", metavar: Optional[str] = None,
                       **changes: Any) -> None:
    """The option for ServingChoice's setting `name` (declared once, with Serving Config's widget);
    `changes` replace fields of its Setting record where the command line differs (type, default)."""
    s = _SERVING[name]
    s = replace(s, help=f"{s.help}; {note}" if note else s.help, **changes)
    _add_setting(group, s, required=False, metavar=metavar)


def _add_setting(group: argparse._ArgumentGroup, s: Setting, *, required: bool, metavar: Optional[str] = None) -> None:
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
                           help=_literal(text))
        return
    metavar = None if s.choices else metavar or _METAVARS.get(s.type, s.name.rsplit("_", 1)[-1].upper())
    group.add_argument(flag, dest=s.name, type=s.type, choices=s.choices or None, default=default,
                       required=required, metavar=metavar, help=_literal(text))


def _literal(text: str) -> str:
    """A setting's help as argparse prints it: argparse %-formats help, and help texts quote
    measured figures ("+14%")."""
    return text.replace("%", "%%")


def is_auto(args: argparse.Namespace) -> bool:
    """Whether --parallel asks the memory planner to decide."""
    return args.parallel.strip().lower() == AUTO


def spec_from_args(args: argparse.Namespace, default_host: str = "127.0.0.1") -> LaunchSpec:
    """The LaunchSpec the parsed options describe (not yet validated: callers call `validate()`, or
    `launch_from_args`). With --parallel auto it is the planner's starting point (one GPU); with
    --gpus count=N the GPUs are left unset (resolving the launch picks them from the visible ones)."""
    mode, degree = ("none", 1) if is_auto(args) else parse_parallel(args.parallel)
    by_count = args.gpus.strip().lower().startswith("count=")
    composite = {"gpus": None if by_count else parse_gpus(args.gpus), "mode": mode, "degree": degree,
                 "extra_flags": tuple(args.extra_flag), "host": args.host or default_host,
                 "lora_paths": startup_from_cli(args.lora, args.lora_expert, args.model).lora_paths}
    data: dict[str, Any] = {}
    for s in SETTINGS:
        value = composite[s.name] if s.name in composite else getattr(args, s.name)
        target = data
        for part in s.path[:-1]:
            target = target.setdefault(part, {})
        target[s.name] = value
    return LaunchSpec.from_dict(data)


def launch_from_args(args: argparse.Namespace, config: LocalConfig, *,
                     server_version: Optional[Version] = None, cfg: bool = True, starts: bool = True,
                     gpu_sizes: Optional[list[float]] = None) -> LaunchPlan:
    """The options resolved into what to launch, exactly as the Local Server node resolves its
    Serving Config (planner for auto, GPU selection, the server-version check, the OOM fallback);
    `cfg`: whether the jobs run CFG (`generate` knows from its guidance; `serve` / `argv` do not);
    `starts`: False for `argv`, which starts nothing, so this machine's GPUs are not required;
    `gpu_sizes`: GPUs to plan for instead of this machine's (`argv --gpu-memory`)."""
    auto = is_auto(args)
    return resolve_launch(spec_from_args(args, default_host=config.host), config, gpus=args.gpus, auto=auto,
                          allow_fp8=auto and args.quantization == "fp8",
                          auto_fallback=bool(getattr(args, "auto_fallback", False)), server_version=server_version,
                          cfg=cfg, starts=starts, speed=args.speed, gpu_sizes=gpu_sizes)
