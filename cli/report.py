"""How the command line shows an error: what / why / fix as text on stderr, or JSON on stdout under --json.

Under --json, stdout holds exactly one JSON object whatever happens, so a script can always
parse it: the result, or {"error": {"what", "why", "fix", "setting", "kind", "raw"}}.
Server-provided text (raw) can hold terminal escapes; both forms strip them.

The core writes its fixes for every surface in the Serving Config / Generate Video widgets'
words ("set frames to 81", "lower the parallel degree"); on the command line the fix names the
options instead (`for_command_line`), found from the command's own argparse declarations.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from typing import Mapping, Optional

from ..errors import LauncherError, SpecError
from ..errors.redact import strip_control

ERROR_FIELDS = ("what", "why", "fix", "setting", "kind", "raw")
# The words before a setting's name where a fix tells what to change ("set frames to 81", "lower the
# parallel degree or the replicas", "turn vae_tiling on", "choose parallel mode 'hsdp'").
_VERBS = r"(?:set|lower|raise|turn|choose|or) (?:the )?"


def error_json(exc: LauncherError) -> dict[str, dict[str, str]]:
    """{"error": {...}}: the JSON form of a LauncherError."""
    return {"error": {name: strip_control(getattr(exc, name) or "") for name in ERROR_FIELDS}}


def report_error(exc: LauncherError, json_mode: bool, flags: Optional[Mapping[str, str]] = None) -> None:
    """Print `exc`; `flags` (`option_flags` of the command's parser) makes its fix name options."""
    if flags:
        exc = for_command_line(exc, flags)
    if json_mode:
        print(json.dumps(error_json(exc), indent=1), flush=True)
    else:
        print(f"error: {strip_control(str(exc))}", file=sys.stderr, flush=True)


def option_flags(parser: argparse.ArgumentParser) -> dict[str, str]:
    """{setting name: option} for the parser's options and for each setting the nodes name otherwise
    (Serving Config's `parallel_degree` is `--parallel`'s N, `vae_patch_parallel` is `--vae-patch`):
    a setting maps to the option whose destination it is, or else to the longest destination it
    starts with (`parallel_mode` -> `parallel`)."""
    from ..planner.launch_plan import ServingChoice          # only when an error is printed
    from ..server.config.settings import settings_of
    from ..server.launch.spec import LaunchSpec

    by_dest = {a.dest: next(o for o in a.option_strings if o.startswith("--")) for a in parser._actions
               if any(o.startswith("--") for o in a.option_strings) and a.dest != argparse.SUPPRESS}
    out = dict(by_dest)
    for s in (*settings_of(ServingChoice), *settings_of(LaunchSpec)):
        if s.name not in out:
            prefixes = [d for d in by_dest if s.name.startswith(d + "_")]
            if prefixes:
                out[s.name] = by_dest[max(prefixes, key=len)]
    return out


def for_command_line(exc: LauncherError, flags: Mapping[str, str]) -> LauncherError:
    """`exc` with its fix naming options: each setting the fix tells to change becomes its option
    ("set --frames to 81", "lower --parallel or --replicas"), and where a launch setting that
    must change (a SpecError's) is still not named, its option leads the fix ("--gpus: use ids 0..1");
    other errors' settings only say where they arose (no GPU here: the fix is another machine)."""
    fix = exc.fix
    for name in sorted(flags, key=len, reverse=True):        # "parallel degree" before "degree"
        words = re.escape(name).replace("_", "[_ ]")
        fix = re.sub(rf"\b({_VERBS}){words}\b", lambda m, f=flags[name]: m.group(1).removesuffix("the ") + f,
                     fix, flags=re.IGNORECASE)
    own = exc.setting if exc.setting.startswith("--") else flags.get(exc.setting)
    if isinstance(exc, SpecError) and own and fix and own not in fix:      # the setting is what to change
        fix = f"{own}: {fix}"
    if fix == exc.fix:
        return exc
    return LauncherError(exc.what, exc.why, fix, setting=exc.setting, raw=exc.raw, kind=exc.kind,
                         raw_label=exc.raw_label)
