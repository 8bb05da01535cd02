"""`serve`: run and supervise one vLLM-Omni server in the foreground until Ctrl-C.

Same launch options as `argv`; the supervisor restarts the server if it crashes after it
was ready, and Ctrl-C (or SIGTERM) stops its whole process group and checks nothing is
left. The server gets a fresh API key that lives only in its environment; to let clients
on other machines use it, `--api-key-file PATH` writes the key there (0600, removed on
exit). `--api-key-from PATH` serves with the key in PATH instead (a systemd credential, a
container secret: the same key across restarts, so clients configure it once). `--no-api-key`
serves without a key, for a trusted machine or network.

As a service (cli/systemd_service.py, docs/deploy/): under systemd it tells the service manager
when the server is ready (`READY=1` on `$NOTIFY_SOCKET`), each phase, and that it stops;
`--print-systemd-unit` prints the unit for these options on this machine and starts nothing.

Several machines (server/supervision/multi_host.py, docs/replicas.md section 7): `--accept-replicas PORT` makes
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
import re
import shlex
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Optional, Union

from ..client.hosts import is_loopback_host
from ..errors import LauncherError
from ..server.config.local_config import LocalConfig, load_local_config, setting_env_var
from ..server.registry import HeadRole, JoinRole, ServerRole, Status, Supervisor, group_members
from ..server.storage import private_files
from ..errors.redact import strip_control
from . import systemd_service
from .exit_codes import ExitCode
from .launch_options import add_launch_options, add_serving_option, launch_from_args


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_launch_options(parser, launching=True)
    add_serving_option(parser, "keep_alive_minutes", type=float, default=None, metavar="N",
                       note="default: the local config's keep_alive_minutes")
    keys = parser.add_mutually_exclusive_group()
    keys.add_argument("--api-key-file", default=None, metavar="PATH",
                      help="write the server's API key to PATH (mode 0600, deleted on exit) for clients")
    keys.add_argument("--api-key-from", default=None, metavar="PATH",
                      help="serve with the API key in PATH (one line; mode 0600 or stricter, not a symlink: a "
                           "systemd credential such as %%d/api-key, a container secret), the same key after every "
                           "restart")
    keys.add_argument("--no-api-key", action="store_true",
                      help="serve without an API key (only on a trusted machine or network)")
    parser.add_argument("--print-systemd-unit", action="store_true",
                        help="print a systemd unit that runs this serve command on this machine (this user, the "
                             "server env, the data dir and config it uses, the key as a credential), start nothing")
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
    """Hand the server's key to clients: `path` replaced by a new 0600 file of ours. The key goes
    into a fresh temporary file beside it, opened O_CREAT|O_EXCL|O_NOFOLLOW, then renamed over
    `path` (private_files.replacing), so nothing planted there, a link or a file, is written
    through or over: the folder may be shared (/tmp) and the key must not land in a file of theirs."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with private_files.replacing(path, setting="api_key_file") as out:
            out.write(f"{key}\n".encode())
    except FileExistsError as exc:
        raise LauncherError(
            f"The API key was not written to {path}",
            f"{exc.filename} is already there (a link or a file someone else put there), and the key is only "
            "ever written into a new file of the launcher's own, never through a link",
            f"remove {exc.filename}, or give --api-key-file a path in a folder that only you can write",
            setting="--api-key-file", raw=str(exc)) from None
    except OSError as exc:      # private_files' DataDirError (a full disk, a link...) or the folder's mkdir
        ours = isinstance(exc, LauncherError)
        raise LauncherError(f"The API key was not written to {path}",
                            exc.why if isinstance(exc, LauncherError) else str(exc.strerror or exc),
                            "give --api-key-file a path in a writable folder that only you can write",
                            setting="--api-key-file", raw="" if ours else str(exc)) from None


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
            systemd_service.notify(f"STATUS={strip_control(f'{status.phase}: {status.text}')}")
    return show


def _role(args: argparse.Namespace, config: LocalConfig) -> ServerRole:
    """The server's role from --accept-replicas / --join (a plain server without either)."""
    if args.join is not None:
        if args.api_key_file or args.api_key_from or args.no_api_key:
            raise LauncherError("--join takes no API key option", "a joined replica has no HTTP port; clients "
                                "send their key to the head", "remove --api-key-file / --api-key-from / "
                                "--no-api-key here and give them to the head's serve", setting="--join")
        return JoinRole.from_config(args.join, config)
    if args.accept_replicas is not None:
        return HeadRole.from_config(args.accept_replicas, config)
    return ServerRole()


def _key_mode(args: argparse.Namespace, role: ServerRole) -> Union[bool, str]:
    """The Supervisor's api_key: the key in --api-key-from, none (--no-api-key, a joined replica), or a
    fresh one per launch."""
    if args.api_key_from:
        return read_key_file(args.api_key_from)
    return not args.no_api_key and not isinstance(role, JoinRole)


KEY_CHARS = re.compile(r"[\x21-\x7e]{16,4096}")      # printable, no spaces: it travels in an HTTP header


def read_key_file(path: str) -> str:
    """The API key in `path`: one line, at least 16 characters, in a regular file that is not a link
    and that no other user can read (a systemd credential is 0400, a container secret as its host file)."""
    where = Path(path).expanduser()
    fix = f"write the key alone on one line into {where} and `chmod 600` it (see --help)"
    try:
        with private_files.open_read(where) as fh:
            mode = os.fstat(fh.fileno()).st_mode
            data = fh.read(8192)
    except OSError as exc:
        raise LauncherError(f"Cannot read the API key file {where}", f"{exc.strerror or exc} (a symbolic link "
                            "or anything but a regular file is refused)", fix, setting="--api-key-from") from None
    if mode & 0o077:
        raise LauncherError(f"The API key file {where} is readable by other users",
                            f"its mode is {mode & 0o777:o}; whoever reads it can use the GPUs",
                            f"chmod 600 {where} (or 400)", setting="--api-key-from")
    key = data.decode("utf-8", "replace").strip()
    if not KEY_CHARS.fullmatch(key):
        raise LauncherError(f"The API key file {where} does not hold one usable key",
                            "a key is one line of at least 16 printable characters without spaces", fix,
                            setting="--api-key-from")
    return key


def _unit_inputs(args: argparse.Namespace, config: LocalConfig) -> systemd_service.UnitInputs:
    """This machine's unit for this serve command: this user, the launcher's python, the config file,
    server env and data dir this command would use, and the key as a credential."""
    import grp
    import pwd

    from ..errors.config_names import CONFIG_VAR, config_file_path
    from ..server.config.server_env import default_server_env

    user = pwd.getpwuid(os.getuid())
    env = {"PYTHONUNBUFFERED": "1", CONFIG_VAR: str(config_file_path().expanduser().absolute())}
    if config.server_command:
        env[setting_env_var("server_command")] = shlex.join(config.server_command)
    else:
        env[setting_env_var("server_env")] = str(Path(config.server_env or default_server_env()).expanduser())
    env[setting_env_var("data_dir")] = str(Path(config.data_dir).expanduser().absolute())
    if config.gpu_lock_dir:
        env[setting_env_var("gpu_lock_dir")] = str(Path(config.gpu_lock_dir).expanduser().absolute())
    keyless = args.no_api_key or args.join is not None or args.api_key_file
    key_path = None if keyless else str(Path(args.api_key_from or systemd_service.DEFAULT_KEY_PATH).expanduser()
                                        .absolute())
    options = _serve_options(args)
    if key_path:
        options += ["--api-key-from", systemd_service.CREDENTIAL_ARG]
    package = Path(__file__).parent.parent          # as imported: a folder named vllm_omni_launcher (or a link)
    role = "a joined replica" if args.join else "a head" if args.accept_replicas else "a server"
    return systemd_service.UnitInputs(
        exec_argv=[sys.executable, "-m", "vllm_omni_launcher", "serve", *options], user=user.pw_name,
        group=grp.getgrgid(user.pw_gid).gr_name, working_directory=str(package.parent.absolute()),
        environment=env, key_path=key_path,
        description=f"vLLM-Omni Launcher: {args.model} as {role} (Wan2.2 for ComfyUI)")


_NOT_IN_UNIT = {"help", "print_systemd_unit", "api_key_from"}


def _serve_options(args: argparse.Namespace) -> list[str]:
    """The serve options in `args` that differ from their defaults, as a command line."""
    parser = argparse.ArgumentParser(add_help=False)
    add_arguments(parser)
    out: list[str] = []
    for action in parser._actions:                 # noqa: SLF001 - argparse has no public list
        value = getattr(args, action.dest, action.default)
        if action.dest in _NOT_IN_UNIT or not action.option_strings or value == action.default:
            continue
        flag = action.option_strings[0]
        if isinstance(action, argparse.BooleanOptionalAction):
            out.append(flag if value else "--no-" + flag[2:])
        elif action.nargs == 0:
            out.append(flag)
        elif isinstance(value, list):
            out += [f"{flag}={item}" for item in value]
        else:
            out += [flag, str(value)]
    return out


def run(args: argparse.Namespace) -> int:
    config = load_local_config()
    role = _role(args, config)
    if args.print_systemd_unit:
        print(systemd_service.render_unit(_unit_inputs(args, config)), end="")
        return ExitCode.OK
    key_mode = _key_mode(args, role)
    if isinstance(role, JoinRole):
        role.reachable()                # a head that is not there: say so before planning anything
    plan = launch_from_args(args, config)
    spec = plan.spec
    if plan.text:
        _say(plan.text)
    for warning in [*plan.warnings, *role.warnings()]:
        print(f"warning: {warning}", file=sys.stderr)
    if args.no_api_key and open_without_key(spec.host):
        print(f"warning: serving on {spec.host} without an API key: anyone who can reach it can use the GPUs",
              file=sys.stderr)
    sup = Supervisor(spec, config, plan.fallback, keep_alive_minutes=args.keep_alive_minutes, api_key=key_mode,
                     role=role)

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
            _announce(sup, spec.served_name, args.no_api_key, key_path, args.api_key_from)
        systemd_service.notify("READY=1", f"STATUS={strip_control(sup.status().text)}")
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
        systemd_service.notify("STOPPING=1", "STATUS=Stopping the server")
        _say("Stopping the server…")
        pgid = sup.pgid
        sup.stop()                      # the supervisor's own stop deadline (server/process/timeouts.py)
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


def open_without_key(host: str) -> bool:
    """Whether a server bound to `host` without an API key is open to other machines: any host but
    loopback in any spelling (127.0.0.0/8, localhost, ::1, [::1]: client/hosts.py's one reading)."""
    return not is_loopback_host(host)


def _announce(sup: Supervisor, name: str, no_api_key: bool, key_path: Optional[Path],
              key_from: Optional[str]) -> None:
    """The server's URL, and where its API key went (or that it has none)."""
    print(f"Serving {name} at {sup.url}  (OpenAI-style API under {sup.url}/v1)", flush=True)
    if no_api_key:
        _say("No API key: requests need no Authorization header.")
    elif key_from is not None:
        print(f"API key: the one in {key_from} (send it as 'Authorization: Bearer <key>').", flush=True)
    elif key_path is not None:
        _write_key(key_path, sup.api_key or "")
        print(f"API key written to {key_path} (mode 0600; send it as 'Authorization: Bearer <key>').", flush=True)
    else:
        _say("The API key exists only in the server's environment; use --api-key-file PATH to hand it to "
             "clients, or --no-api-key on a trusted machine.")


def _leftovers(pgid: Optional[int]) -> list[int]:
    if pgid is None:
        return []
    return [p.pid for p in group_members(pgid)]
