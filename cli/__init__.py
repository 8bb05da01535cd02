"""`python -m vllm_omni_launcher COMMAND`: argv, serve, generate, plan, doctor, setup.

Each command lives in its own module and registers its arguments; the modules are imported
only when their command runs, so `argv` works without the HTTP or GPU dependencies.

Conventions shared by every command: results (the argv, the URL, paths written, reports, JSON)
go to stdout; progress, phases, warnings and errors go to stderr. Under `--json` stdout holds
exactly one JSON object, errors included: {"error": {"what", "why", "fix", "setting", "kind",
"raw"}}. Exit codes are in exit_codes.py and under --help.
"""
from __future__ import annotations

import argparse
import importlib
import sys
import traceback
from typing import NoReturn, Optional, Sequence

from ..errors import LauncherError
from . import usage_hints
from .exit_codes import ExitCode, epilog
from .report import option_flags, report_error
from .version import package_version

PROG = "python -m vllm_omni_launcher"
DESCRIPTION = ("Launch, supervise and use a vLLM-Omni server for Wan2.2 video.\n"
               "Results go to stdout; progress, warnings and errors to stderr\n"
               "(under --json, errors are JSON on stdout too).")
COMMANDS = {        # in the order a new user needs them (--help lists them so)
    "setup": ("setup_cmd", "create, repair or upgrade the server environment (pinned vllm + vllm-omni), then check it"),
    "doctor": ("doctor_cmd", "check GPUs, the server environment, the model folder and ports"),
    "generate": ("generate_cmd", "generate a video through a running or supervised server"),
    "serve": ("serve_cmd", "run and supervise a vLLM-Omni server in the foreground until Ctrl-C"),
    "plan": ("plan_cmd", "estimate GPU memory for a launch spec and request shape, and recommend a config"),
    "argv": ("argv_cmd", "print the vllm serve argv and environment for a launch spec (starts nothing)"),
}


class _Parser(argparse.ArgumentParser):
    """argparse whose usage errors put the one useful line first: the error, a did-you-mean for a
    mistyped option or command, how to write `--extra-flag --x=1`, then one usage line pointing
    at --help (not argparse's ~35 lines of usage above it); as JSON when the command line asked
    for --json."""

    json_errors = False
    tokens: Sequence[str] = ()          # what this parser was given (for the hints)

    def error(self, message: str) -> NoReturn:
        unknown = usage_hints.unknown_options(self, self.tokens)
        if unknown and message.startswith(("the following arguments are required", "unrecognized arguments")):
            message = f"unrecognized arguments: {' '.join(unknown)}"     # the typo, not what it left missing
        hints = usage_hints.hints(self, message, self.tokens, unknown)
        if self.json_errors:
            report_error(LauncherError(message, "the command line is not valid",
                                       "; ".join([*hints, f"see `{self.prog} --help`"]), kind="usage"), True)
        else:
            lines = [f"error: {message}", *(f"  {h}" for h in hints),
                     f"usage: {self.prog}{' COMMAND' if self.prog == PROG else ''} [options] "
                     f"(`{self.prog} --help` lists them)"]
            print("\n".join(lines), file=sys.stderr, flush=True)
        raise SystemExit(ExitCode.USAGE)


def build_parser(command: Optional[str] = None) -> argparse.ArgumentParser:
    """The top-level parser, or with `command` that command's full parser (used by --help and tests)."""
    common = {"epilog": epilog(), "formatter_class": argparse.RawDescriptionHelpFormatter}
    if command is None:
        parser = _Parser(prog=PROG, description=DESCRIPTION, **common)
        parser.add_argument("--version", action="version", version=f"%(prog)s {package_version()}",
                            help="print the launcher's version and exit")
        sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                    help="one of these; `COMMAND --help` shows its options")
        for name, (_module, help_text) in COMMANDS.items():
            sub.add_parser(name, help=help_text, add_help=False)
        return parser
    module = importlib.import_module(f".{COMMANDS[command][0]}", __name__)
    parser = _Parser(prog=f"{PROG} {command}", description=COMMANDS[command][1], **common)
    module.add_arguments(parser)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run one command; returns its exit code (see exit_codes.py)."""
    tokens = list(sys.argv[1:] if argv is None else argv)
    json_mode = "--json" in tokens
    try:
        top = build_parser()
        top.json_errors = json_mode
        args, rest = top.parse_known_args(tokens)
        parser = build_parser(args.command)
        parser.json_errors = json_mode
        parser.tokens = rest
        cmd_args = parser.parse_args(rest)
    except SystemExit as exc:           # --help, --version, usage errors
        return int(exc.code or 0)
    json_mode = bool(getattr(cmd_args, "json", False))
    module = importlib.import_module(f".{COMMANDS[args.command][0]}", __name__)
    try:
        return int(module.run(cmd_args) or 0)
    except LauncherError as exc:
        report_error(exc, json_mode, option_flags(parser))      # its fix names this command's options
        return ExitCode.LAUNCHER_ERROR
    except KeyboardInterrupt:
        report_error(LauncherError("Interrupted", "Ctrl-C arrived before the command finished",
                                   kind="interrupted"), json_mode)
        return ExitCode.INTERRUPTED
    except Exception as exc:  # noqa: BLE001 (the last line of defence: a bug still gets a clear exit code)
        traceback.print_exc(file=sys.stderr)
        report_error(LauncherError(f"Internal error: {type(exc).__name__}: {exc}",
                                   "this is a bug in the launcher, not in your settings",
                                   "report it with the traceback above", kind="internal"), json_mode)
        return ExitCode.INTERNAL
