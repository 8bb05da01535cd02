"""`argv`: show exactly what would be launched, without launching it.

The output is deterministic: where neither --port nor the local config names a port, the
argv shows PORT_PLACEHOLDER (8091) instead of the free port a launch would pick, and says so
on stderr, so the same options print the same command on every call. `--parallel auto` shows
what the memory planner picks for this machine's GPUs, or for the GPUs --gpu-memory gives (the
GPU machine's, say), with its reasoning on stderr; where neither says a size, it refuses rather
than print a one-GPU command the planner never chose.
"""
from __future__ import annotations

import argparse
import json
import sys

from ..server.config.local_config import load_local_config
from ..server.launch.versions import DEFAULT_VERSION
from .launch_options import PORT_PLACEHOLDER, add_launch_options, launch_from_args
from .size_options import add_gpu_memory_option


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_launch_options(parser)
    add_gpu_memory_option(parser.add_argument_group("GPUs"), note="what --parallel auto plans for and the "
                          "explicit settings are checked against (default: this machine's)")
    parser.add_argument("--json", action="store_true",
                        help='print {"argv": [...], "env": {...}, "port_placeholder": true|false}')


def run(args: argparse.Namespace) -> int:
    config = load_local_config()
    # Resolved as a launch would be (the planner for --parallel auto), but the flags are checked
    # against the pinned line: argv starts nothing, so it does not probe the server environment
    # and prints the command on a machine without GPUs too (for the GPU machine).
    plan = launch_from_args(args, config, server_version=DEFAULT_VERSION, starts=False, gpu_sizes=args.gpu_memory)
    spec = plan.spec
    report = plan.report()
    if report:
        print(report, file=sys.stderr)
    executable = list(config.server_command) or ["vllm"]
    port = spec.port or config.port
    command = spec.build(executable, port or PORT_PLACEHOLDER, api_key="***",
                         trust_remote_code=config.trust_remote_code)
    if args.json:
        print(json.dumps({**command.redacted(), "port_placeholder": port is None}))
    else:
        print(command.shell())
    if port is None:
        print(f"note: no port is set (--port or the local config), so {PORT_PLACEHOLDER} is shown; "
              "a launch picks a free port instead", file=sys.stderr)
    return 0
