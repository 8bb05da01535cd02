"""`python -m vllm_omni_launcher COMMAND`: argv, serve, generate, plan, doctor.

Each command lives in its own module and registers its arguments; the modules are imported
only when their command runs, so `argv` works without the HTTP or GPU dependencies.
"""
from __future__ import annotations

import argparse
import importlib
import sys
from typing import Optional, Sequence

from ..errors import LauncherError

COMMANDS = {
    "argv": ("argv_cmd", "print the vllm serve argv and environment for a launch spec (starts nothing)"),
    "serve": ("serve_cmd", "run and supervise a vLLM-Omni server in the foreground until Ctrl-C"),
    "generate": ("generate_cmd", "generate a video through a running or supervised server"),
    "plan": ("plan_cmd", "estimate GPU memory for a launch spec and request shape, and recommend a config"),
    "doctor": ("doctor_cmd", "check GPUs, the server environment, the model folder and ports"),
}


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vllm_omni_launcher", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (_module, help_text) in COMMANDS.items():
        sub.add_parser(name, help=help_text, add_help=False)
    args, rest = parser.parse_known_args(argv)
    module = importlib.import_module(f".{COMMANDS[args.command][0]}", __name__)
    cmd_parser = argparse.ArgumentParser(prog=f"python -m vllm_omni_launcher {args.command}",
                                         description=COMMANDS[args.command][1])
    module.add_arguments(cmd_parser)
    cmd_args = cmd_parser.parse_args(rest)
    try:
        return int(module.run(cmd_args) or 0)
    except LauncherError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
