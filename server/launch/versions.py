"""Which vLLM / vLLM-Omni the server environment holds, read once per server command.

The launcher supports the 0.26 and 0.30 lines (a few flags differ between them, and
server/launch/flags.py records which; so do a few request form fields). Upstream only *warns* when
vLLM and vLLM-Omni differ in major.minor and then misbehaves, so the launcher refuses that
pairing before starting.
"""
from __future__ import annotations

import functools
import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from ...errors import LauncherError
from ..config import environment
from ..config.server_env import SETUP_COMMAND
from .flags import Version

if TYPE_CHECKING:
    from ..config.local_config import LocalConfig

DEFAULT_VERSION: Version = (0, 30)    # the line the launcher pins (setup, create_server_env.sh)
PINNED_RELEASE = "%d.%d.0" % DEFAULT_VERSION   # the vllm / vllm-omni pair setup installs (create_server_env.sh's)

SUPPORTED: tuple[Version, ...] = ((0, 26), (0, 30))
_PROBE = ("import json, sys\nfrom importlib.metadata import version, PackageNotFoundError\n"
          "out = {'python': sys.version.split()[0]}\n"
          "for name in ('vllm', 'vllm-omni'):\n"
          "    try: out[name] = version(name)\n"
          "    except PackageNotFoundError: out[name] = None\n"
          "print(json.dumps(out))\n")


@dataclass(frozen=True)
class ServerVersions:
    python: str
    vllm: Optional[str]
    vllm_omni: Optional[str]

    @property
    def omni_minor(self) -> tuple[int, int]:
        return _major_minor(self.vllm_omni) if self.vllm_omni else DEFAULT_VERSION

    def check(self) -> None:
        """Refuse environments that cannot serve (missing package, mismatched pair, unknown line)."""
        if not self.vllm or not self.vllm_omni:
            missing = "vllm" if not self.vllm else "vllm-omni"
            raise LauncherError(
                f"The server environment has no {missing}",
                "`vllm serve --omni` needs both vllm and vllm-omni installed there",
                f"run `{SETUP_COMMAND}` (it installs the pinned pair), or fix the server command "
                "in the launcher config", setting="server_env")
        if _major_minor(self.vllm) != _major_minor(self.vllm_omni):
            raise LauncherError(
                f"vLLM {self.vllm} and vLLM-Omni {self.vllm_omni} do not match",
                "their major.minor must be equal; upstream only warns ('appear to have mismatched "
                "major/minor versions') and then fails in odd ways",
                f"install vllm=={self.vllm_omni} in the server environment (`{SETUP_COMMAND} "
                f"--version {self.vllm_omni}`)", setting="server_env")
        if self.omni_minor not in SUPPORTED:
            raise LauncherError(
                f"vLLM-Omni {self.vllm_omni} is not a version this launcher knows",
                "supported lines: " + supported_lines(),
                f"repair the server environment with `{SETUP_COMMAND}` (it pins {PINNED_RELEASE})",
                setting="server_env")


def supported_lines() -> str:
    """The supported vLLM-Omni lines as the error and doctor texts name them: "0.26, 0.30"."""
    return ", ".join(f"{a}.{b}" for a, b in SUPPORTED)


def _major_minor(text: str) -> tuple[int, int]:
    parts = (text.split("+")[0].split(".") + ["0", "0"])[:2]
    try:
        return int(parts[0]), int(parts[1])
    except ValueError:
        return (0, 0)


def server_python(command: list[str], explicit: Optional[str] = None) -> Optional[str]:
    """The interpreter behind the server command: explicit, a python argv[0], or a script's shebang."""
    if explicit:
        return explicit
    if not command:
        return None
    first = command[0]
    if Path(first).name.startswith("python"):
        return first
    path = Path(first)
    sibling = path.parent / "python"
    if path.is_file() and sibling.exists():
        return str(sibling)
    try:
        with open(path, "rb") as fh:
            line = fh.readline().decode(errors="replace").strip()
    except OSError:
        return None
    parts = line[2:].split() if line.startswith("#!") else []
    if parts:
        return parts[-1] if Path(parts[0]).name == "env" else parts[0]   # "#!/usr/bin/env python3"
    return None


@functools.lru_cache(maxsize=8)
def _probe(python: str, extra_env: tuple[tuple[str, str], ...], key_variables: frozenset[str]) -> ServerVersions:
    # The environment a launch would give the server (allow-listed: no PYTHONPATH of ComfyUI's and
    # none of the launcher's remote keys), plus the operator's extra_env.
    env = {k: v for k, v in os.environ.items() if environment.is_inherited(k, key_variables)} | dict(extra_env)
    try:
        out = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True, timeout=60, env=env)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise LauncherError(f"Cannot run the server environment's python ({python})", str(exc),
                            "check the server command / server environment in the launcher config",
                            setting="server_env") from exc
    if out.returncode != 0:
        raise LauncherError(f"The server environment's python failed ({python})", "see the output below",
                            f"repair it with `{SETUP_COMMAND}`", setting="server_env", raw=out.stderr)
    data = json.loads(out.stdout.strip().splitlines()[-1])
    return ServerVersions(data["python"], data.get("vllm"), data.get("vllm-omni"))


def checked_server_version(config: "LocalConfig") -> Version:
    """The server environment's vLLM-Omni (major, minor), after refusing a missing or mismatched pair.

    The one pre-launch version check every launch path calls (Local Server node, `serve`,
    `generate --model`): the result is the version the extra flags are validated against.
    Where the interpreter behind the server command cannot be located (a wrapper script),
    nothing can be checked and the default line (DEFAULT_VERSION) is assumed.
    """
    found = detect(config.resolved_server_command(), extra_env=config.extra_env,
                   key_variables=config.key_variables())
    if found is None:
        return DEFAULT_VERSION
    found.check()
    return found.omni_minor


def detect(command: list[str], explicit_python: Optional[str] = None,
           extra_env: Optional[dict[str, str]] = None,
           key_variables: frozenset[str] = frozenset()) -> Optional[ServerVersions]:
    """Versions in the server environment, or None when its interpreter cannot be located.

    `extra_env` is what the server is started with (the local config's extra_env);
    `key_variables`: the local config's remote-key variables, withheld as from a launch.
    """
    python = server_python(command, explicit_python)
    return _probe(python, tuple(sorted((extra_env or {}).items())), key_variables) if python else None
