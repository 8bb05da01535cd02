"""Where the server program is: the one precedence for every caller, and the default server env.

The server environment (vllm + vllm-omni, never ComfyUI's venv) lives by default in
`$XDG_DATA_HOME/vllm-omni-launcher/server-env` (`~/.local/share/...` when XDG_DATA_HOME is
unset). `python -m vllm_omni_launcher setup` and `create_server_env.sh` create it there, and
the launcher finds it there by itself, so a first run needs no setting. It is deliberately not
under the launcher's data_dir: that one differs between ComfyUI (`user/vllm_omni_launcher`)
and a terminal (`~/.cache/...`), and `setup` runs in a terminal.

Precedence (explicit settings always win): `server_command`; `server_env` (an error when it
holds no bin/vllm, rather than silently running something else); the default location when
it holds bin/vllm; `vllm` on PATH. Every "cannot find the server" message prints
SETUP_COMMAND. A local server needs Linux (or WSL2): platform_check refuses Windows first.

SETUP_COMMAND is a command this very interpreter can run, since ComfyUI-Manager installs the
pack without `pip install -e`: `<this python> -m vllm_omni_launcher setup` when the package is
importable under that name (a portable or conda ComfyUI has no `python` of its own on PATH, so
the interpreter is named), else `bash <the pack>/server/create_server_env.sh`, which needs no
import at all.
"""
from __future__ import annotations

import os
import shlex
import shutil
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from ...errors import LauncherError
from ...errors.config_names import env_var
from .platform_check import require_local_server_platform

PACKAGE = "vllm_omni_launcher"                  # the name `pip install -e` makes the pack importable by
SETUP_SCRIPT = Path(__file__).resolve().parent.parent / "create_server_env.sh"
_APP_DIR = "vllm-omni-launcher"


def package_importable() -> bool:
    """Whether a new process of this interpreter can `-m vllm_omni_launcher`: the import system's
    finders are asked directly, never sys.modules (ComfyUI enters a custom node's folder there under
    the folder's name, which says nothing about what a new process can import)."""
    for finder in sys.meta_path:
        find_spec = getattr(finder, "find_spec", None)
        try:
            if find_spec is not None and find_spec(PACKAGE, None) is not None:
                return True
        except (ImportError, ValueError, OSError):
            continue
    return False


def setup_command(path: Optional[str] = None, *, importable: Optional[bool] = None) -> str:
    """The command that creates (or repairs) the server env, at `path` or the default place, which
    this machine can run as printed (the module docstring says which and why). `importable`:
    package_importable(), asked when not given."""
    if package_importable() if importable is None else importable:
        command = f"{shlex.quote(sys.executable or 'python3')} -m {PACKAGE} setup"
        return command + (f" --path {shlex.quote(path)}" if path else "")
    return f"bash {shlex.quote(str(SETUP_SCRIPT))}" + (f" {shlex.quote(path)}" if path else "")


SETUP_COMMAND = setup_command()


def default_server_env(environ: Optional[Mapping[str, str]] = None) -> Path:
    """The server env `setup` creates and the launcher finds without a setting (same rule as the script)."""
    env = os.environ if environ is None else environ
    base = env.get("XDG_DATA_HOME", "").strip() or "~/.local/share"
    return Path(base).expanduser() / _APP_DIR / "server-env"


@dataclass(frozen=True)
class ServerProgram:
    """The argv prefix that is `vllm`, and which rule found it (shown by doctor and setup)."""

    command: tuple[str, ...]
    source: str


def locate_server_program(server_command: tuple[str, ...], server_env: Optional[str], *,
                          environ: Optional[Mapping[str, str]] = None,
                          which: Optional[Callable[[str], Optional[str]]] = None) -> ServerProgram:
    """Apply the precedence in the module docstring; raise a LauncherError naming SETUP_COMMAND."""
    require_local_server_platform()
    if server_command:
        return ServerProgram(tuple(server_command), "server_command")
    if server_env:
        candidate = Path(server_env).expanduser() / "bin" / "vllm"
        if candidate.exists():
            return ServerProgram((str(candidate),), f"server_env {Path(server_env).expanduser()}")
        raise LauncherError(
            f"No vllm in the server environment {server_env}", f"{candidate} does not exist",
            f"run `{setup_command(server_env)}` to create or repair it, or fix "
            f"{env_var('server_env')} / 'server_env'", setting="server_env", kind="config")
    default = default_server_env(environ)
    if (default / "bin" / "vllm").exists():
        return ServerProgram((str(default / "bin" / "vllm"),), f"default server env {default}")
    found = (which or shutil.which)("vllm")
    if found:
        return ServerProgram((found,), f"`vllm` on PATH ({found})")
    raise LauncherError(
        "Cannot find the vLLM-Omni server program",
        f"no server environment is configured (server_env / server_command), {default} holds none, "
        "and `vllm` is not on PATH",
        f"run `{SETUP_COMMAND}` on the GPU machine (it creates {default}, which the launcher then finds by "
        f"itself), or set {env_var('server_env')} / 'server_env' to an existing server environment",
        setting="server_env", kind="config")
