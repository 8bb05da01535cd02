"""`serve`: run and supervise one vLLM-Omni server in the foreground until Ctrl-C.

Same launch options as `argv`; the supervisor restarts the server if it crashes after it
was ready, and Ctrl-C (or SIGTERM) stops its whole process group and checks nothing is
left. The server gets a fresh API key that lives only in its environment; to let clients
on other machines use it, `--api-key-file PATH` writes the key there (0600, removed on
exit). `--no-api-key` serves without a key, for a trusted machine or network.

Several machines (server/multi_host.py, docs/replicas.md section 7): `--accept-replicas PORT` makes
this server vLLM-Omni's head, accepting replicas on PORT at the local config's
replica_registration_host; `--join ADDR:PORT` runs, on a GPU box, a supervised headless replica that
registers with that head (no HTTP port, no key; clients use the head's endpoint).

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
from ..server.local_config import LocalConfig, load_local_config
from ..server.multi_host import HeadRole, JoinRole, ServerRole
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
    roles = parser.add_argument_group("several machines (vLLM-Omni head and headless replicas)")
    role = roles.add_mutually_exclusive_group()
    role.add_argument("--accept-replicas", type=int, default=None, metavar="PORT",
                      help="be the head: replicas started elsewhere with `serve --join ADDR:PORT` register on PORT "
                           "at the launcher config's replica_registration_host (default 127.0.0.1: this machine "
                           "only). WARNING: upstream's registration has NO authentication; whoever reaches the "
                           "port can join and receive every prompt and image, so open it only on a network that "
                           "only your GPU boxes share")
    role.add_argument("--join", default=None, metavar="ADDR:PORT",
                      help="run a supervised headless replica (the launch options say model, GPUs, layout and "
                           "replicas) that registers with the head at ADDR:PORT; it has no HTTP port: clients use "
                           "the head's endpoint")


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


def _role(args: argparse.Namespace, config: LocalConfig) -> ServerRole:
    """The server's role from --accept-replicas / --join (a plain server without either)."""
    if args.join is not None:
        if args.api_key_file or args.no_api_key:
            raise LauncherError("--join takes no API key option", "a joined replica has no HTTP port; clients "
                                "send their key to the head", "remove --api-key-file / --no-api-key here and give "
                                "them to the head's serve", setting="--join")
        return JoinRole.from_config(args.join, config)
    if args.accept_replicas is not None:
        return HeadRole.from_config(args.accept_replicas, config)
    return ServerRole()


def run(args: argparse.Namespace) -> int:
    config = load_local_config()
    role = _role(args, config)
    if isinstance(role, JoinRole):
        role.reachable()                # a head that is not there: say so before planning anything
    plan = launch_from_args(args, config)
    spec = plan.spec
    if plan.text:
        _say(plan.text)
    for warning in [*plan.warnings, *role.warnings()]:
        print(f"warning: {warning}", file=sys.stderr)
    if args.no_api_key and spec.host not in ("127.0.0.1", "localhost", "::1"):
        print(f"warning: serving on {spec.host} without an API key: anyone who can reach it can use the GPUs",
              file=sys.stderr)
    sup = Supervisor(spec, config, plan.fallback, keep_alive_minutes=args.keep_alive_minutes,
                     api_key=not args.no_api_key and not isinstance(role, JoinRole), role=role)

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
        if isinstance(role, JoinRole):
            print(role.joined_text(sup.spec), flush=True)
        else:
            _announce(sup, spec.served_name, args.no_api_key, key_path)
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


def _announce(sup: Supervisor, name: str, no_api_key: bool, key_path: Optional[Path]) -> None:
    """The server's URL, and where its API key went (or that it has none)."""
    print(f"Serving {name} at {sup.url}  (OpenAI-style API under {sup.url}/v1)", flush=True)
    if no_api_key:
        _say("No API key: requests need no Authorization header.")
    elif key_path is not None:
        _write_key(key_path, sup.api_key or "")
        print(f"API key written to {key_path} (mode 0600; send it as 'Authorization: Bearer <key>').", flush=True)
    else:
        _say("The API key exists only in the server's environment; use --api-key-file PATH to hand it to "
             "clients, or --no-api-key on a trusted machine.")


def _leftovers(pgid: Optional[int]) -> list[int]:
    if pgid is None:
        return []
    from ..server.process_group import group_members

    return [p.pid for p in group_members(pgid)]
