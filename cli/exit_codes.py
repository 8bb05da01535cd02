"""The command line's exit codes: one per kind of outcome, so scripts can tell them apart.

The table is printed under every command's --help and documented in the README.
"""
from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    LAUNCHER_ERROR = 1       # a LauncherError: printed as what / why / fix (JSON under --json)
    USAGE = 2                # the command line itself is wrong (argparse's own code)
    DOES_NOT_FIT = 3         # plan: no configuration fits the GPUs (and host RAM) for this request
    PROBLEMS_FOUND = 4       # doctor: at least one check found a problem
    INTERNAL = 70            # an unexpected exception, a bug in the launcher (traceback on stderr)
    INTERRUPTED = 130        # Ctrl-C / SIGTERM before the command finished (128 + SIGINT)


MEANING = {
    ExitCode.OK: "success (serve: stopped cleanly after Ctrl-C)",
    ExitCode.LAUNCHER_ERROR: "a launcher error: what happened, why, and the fix (JSON under --json)",
    ExitCode.USAGE: "usage error: an unknown option or a bad value on the command line",
    ExitCode.DOES_NOT_FIT: "plan: no configuration fits these GPUs / host RAM for the request",
    ExitCode.PROBLEMS_FOUND: "doctor: at least one check found a problem",
    ExitCode.INTERNAL: "unexpected internal error (a bug: please report the traceback)",
    ExitCode.INTERRUPTED: "interrupted (Ctrl-C) before the command finished",
}


def epilog() -> str:
    """The exit-code table for --help."""
    return "exit codes:\n" + "\n".join(f"  {int(code):>3}  {text}" for code, text in MEANING.items()) + "\n"
