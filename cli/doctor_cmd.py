"""`doctor`: check GPUs, peer-to-peer, the server environment, disk, the model folder and the port,
and (`--loras DIR`) list the LoRAs in a folder with how this server version can serve each, and
(`--models DIR`) the Diffusers folders Load Model lists or leaves out, with why. The first line
is the verdict: the problems and warnings by name, and whether this is a GPU box or a client-only
one (no NVIDIA GPU: a missing server environment is then expected, not a problem).

Works on a machine without a GPU: each check it cannot run says so and why. Exit code 4
(ExitCode.PROBLEMS_FOUND) when a check found a problem, 0 otherwise.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..planner.doctor import run_doctor
from ..server.config.local_config import load_local_config
from .exit_codes import ExitCode


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=None,
                        help="HF id or local folder to check (folder validity, or disk space for the download)")
    parser.add_argument("--port", type=int, default=None, help="port to check (default: the local config's)")
    parser.add_argument("--host", default=None, help="host to check the port on (default: the local config's)")
    parser.add_argument("--timeout", type=float, default=90.0, metavar="SECONDS",
                        help="how long the server environment's version script may take (default: 90)")
    parser.add_argument("--loras", action="append", default=[], type=Path, metavar="DIR",
                        help="a LoRA folder (e.g. ComfyUI/models/loras; repeatable): list each .safetensors file "
                             "and PEFT folder in it and whether the server environment's vLLM-Omni can serve it "
                             "(fused at startup, per request, or not, and why)")
    parser.add_argument("--models", action="append", default=[], type=Path, metavar="DIR",
                        help="a Diffusers model folder (e.g. ComfyUI/models/diffusers; repeatable): list the Wan2.2 "
                             "folders Load Model shows from it and the ones it leaves out, with why")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace) -> int:
    report = run_doctor(args.model, config=load_local_config(), host=args.host, port=args.port,
                        timeout_s=args.timeout, lora_roots=[d.expanduser() for d in args.loras],
                        model_roots=[d.expanduser() for d in args.models])
    if args.json:
        print(json.dumps(report.to_dict(), indent=1))
    else:
        print(report.text())
    return ExitCode.OK if report.ok else ExitCode.PROBLEMS_FOUND
