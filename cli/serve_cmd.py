"""`serve`: run and supervise one vLLM-Omni server in the foreground until Ctrl-C.

Same launch options as `argv`; the supervisor restarts the server if it crashes after it
was ready, and Ctrl-C (or SIGTERM) stops its whole process group and checks nothing is
left. The server gets a fresh API key that lives only in its environment; to let clients
on other machines use it, `--api-key-file PATH` writes the key there (0600, removed on
exit). `--no-api-key` serves without a key, for a trusted machine or network.

The options are resolved exactly as the Local Server node resolves its Serving Config
(planner/launch_plan.resolve_launch: the planner for `--parallel auto`, GPU selection, the OOM
fallback, and, before anything starts, the server environment's vllm / vllm-omni pair). Results (the URL
line and where the key was written) go to stdout; phases, hints and the stop report to stderr.
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Optional

from ..errors import LauncherError
from ..server.local_config import load_local_config
from ..server.redact import strip_control
from ..server.registry import Status, Supervisor
from .exit_codes import ExitCode
from .launch_options import add_launch_options, add_serving_option, launch_from_args


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_launch_options(parser, launching=True)
    add_serving_option(parser, "keep_alive_minutes", type=float, default=None, metavar="N",
                       note="default: the local config's keep_alive_minutes")
    keys = parser.add_mutually_exclusive_group()
    keys.add_argument("--api-key-file", default=None, metavar="PATH",
                      help="write the server's API key to PATH (mode 0600, deleted on exit) for clients")
    keys.add_argument("--no-api-key", action="store_true",
                      help="serve without an API key (only on a trusted machine or network)")
    parser.add_argument("--startup-timeout", type=float, default=None, metavar="SECONDS",
                        help="give up if not ready after this long (default: scaled by model size)")


def _write_key(path: Path, key: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(key + "\n")
    os.replace(tmp, path)


def _say(text: str) -> None:
    """Progress and hints: stderr, so stdout carries only the results."""
    print(text, file=sys.stderr, flush=True)


def _printer() -> Callable[[Status], None]:
    last: list[Optional[str]] = [None]

    def show(status: Status) -> None:
        line = f"[{time.strftime('%H:%M:%S')}] {status.phase}: {status.text}"
        if line != last[0]:
            last[0] = line
            _say(line)
    return show


def run(args: argparse.Namespace) -> int:
    config = load_local_config()
    plan = launch_from_args(args, config)
    spec = plan.spec
    if plan.text:
        _say(plan.text)
    for warning in plan.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    if args.no_api_key and spec.host not in ("127.0.0.1", "localhost", "::1"):
        print(f"warning: serving on {spec.host} without an API key: anyone who can reach it can use the GPUs",
              file=sys.stderr)
    sup = Supervisor(spec, config, plan.fallback, keep_alive_minutes=args.keep_alive_minutes,
                     api_key=not args.no_api_key)

    stop_requested = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        stop_requested.set()
        sup.request_stop()      # unblocks a start in progress; the main thread stops cleanly below

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    key_path = Path(args.api_key_file).expanduser() if args.api_key_file else None
    code: int = ExitCode.OK
    try:
        try:
            sup.start(on_status=_printer(), timeout=args.startup_timeout)
        except LauncherError:
            if stop_requested.is_set():
                _say("Stopped before the server was ready.")
                return ExitCode.INTERRUPTED
            raise                       # reported by the CLI (text or JSON) after the stop below
        print(f"Serving {spec.served_name} at {sup.url}  (OpenAI-style API under {sup.url}/v1)", flush=True)
        if args.no_api_key:
            _say("No API key: requests need no Authorization header.")
        elif key_path is not None:
            _write_key(key_path, sup.api_key or "")
            print(f"API key written to {key_path} (mode 0600; send it as 'Authorization: Bearer <key>').",
                  flush=True)
        else:
            _say("The API key exists only in the server's environment; use --api-key-file PATH to hand it to "
                 "clients, or --no-api-key on a trusted machine.")
        _say("Press Ctrl-C to stop.")
        written_key = sup.api_key
        while not stop_requested.wait(0.5):
            status = sup.status()
            if key_path is not None and sup.api_key and sup.api_key != written_key:
                _write_key(key_path, sup.api_key)      # a restart made a new key
                written_key = sup.api_key
            if status.phase == "failed":
                _say(f"error: {strip_control(str(sup.last_error or status.text))}")
                code = ExitCode.LAUNCHER_ERROR
                break
            if status.phase == "stopped" and not sup.alive():
                _say("The server stopped (keep-alive expired).")
                break
    finally:
        _say("Stopping the server…")
        pgid = sup.pgid
        sup.stop(timeout=30)
        if key_path is not None:
            key_path.unlink(missing_ok=True)
        left = _leftovers(pgid)
        if left:
            _say(f"warning: processes {left} of the server did not exit")
            code = code or ExitCode.LAUNCHER_ERROR
        else:
            _say("Stopped; no server process is left.")
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return code


def _leftovers(pgid: Optional[int]) -> list[int]:
    if pgid is None:
        return []
    from ..server.process_group import group_members

    return [p.pid for p in group_members(pgid)]
