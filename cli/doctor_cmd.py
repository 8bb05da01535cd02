"""`doctor`: check GPUs, peer-to-peer, the server environment, disk, the model folder and the port.

Works on a machine without a GPU: each check it cannot run says so and why. Exit code 4
(ExitCode.PROBLEMS_FOUND) when a check found a problem, 0 otherwise.
"""
from __future__ import annotations

import argparse
import json

from ..planner.doctor import run_doctor
from ..server.local_config import load_local_config
from .exit_codes import ExitCode


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=None,
                        help="HF id or local folder to check (folder validity, or disk space for the download)")
    parser.add_argument("--port", type=int, default=None, help="port to check (default: the local config's)")
    parser.add_argument("--host", default=None, help="host to check the port on (default: the local config's)")
    parser.add_argument("--timeout", type=float, default=90.0, metavar="SECONDS",
                        help="how long the server environment's version script may take (default: 90)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace) -> int:
    report = run_doctor(args.model, config=load_local_config(), host=args.host, port=args.port,
                        timeout_s=args.timeout)
    if args.json:
        print(json.dumps(report.to_dict(), indent=1))
    else:
        print(report.text())
    return ExitCode.OK if report.ok else ExitCode.PROBLEMS_FOUND
