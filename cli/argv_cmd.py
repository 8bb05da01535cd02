"""`argv`: show exactly what would be launched, without launching it."""
from __future__ import annotations

import argparse
import json
import shlex
import socket

from ..server.local_config import load_local_config
from .launch_options import add_launch_options, spec_from_args


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_launch_options(parser)
    parser.add_argument("--json", action="store_true", help='print {"argv": [...], "env": {...}}')


def _free_port(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def run(args: argparse.Namespace) -> int:
    config = load_local_config()
    spec = spec_from_args(args, default_host=config.host)
    warnings = spec.validate()
    executable = list(config.server_command) or ["vllm"]
    command = spec.build(executable, spec.port or config.port or _free_port(spec.host),
                         api_key="***", trust_remote_code=config.trust_remote_code)
    shown = command.redacted()
    if args.json:
        print(json.dumps(shown))
    else:
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in shown["env"].items())
        print((env + " " if env else "") + shlex.join(shown["argv"]))
    for warning in warnings:
        print(f"warning: {warning}", file=__import__("sys").stderr)
    return 0
