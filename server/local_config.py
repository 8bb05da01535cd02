"""The local machine's configuration: what no workflow may decide.

A workflow JSON is shared by strangers, so the program to execute, the host to bind, remote
code trust and API keys come only from here: environment variables first, then a JSON file
(`vllm_omni_launcher.json` in ComfyUI's user directory, or the path in
VLLM_OMNI_LAUNCHER_CONFIG). Nodes and the CLI read it; they never write it.
"""
from __future__ import annotations

import json
import os
import shlex
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from ..errors import LauncherError

ENV_PREFIX = "VLLM_OMNI_LAUNCHER_"
CONFIG_FILE_NAME = "vllm_omni_launcher.json"


@dataclass(frozen=True)
class LocalConfig:
    """Settings owned by the machine's operator."""

    server_command: tuple[str, ...] = ()      # e.g. ("/opt/vllm-env/bin/vllm",); empty: find `vllm`
    server_env: Optional[str] = None          # venv made by create_server_env.sh
    host: str = "127.0.0.1"
    port: Optional[int] = None                # None: free port per launch
    trust_remote_code: bool = False
    data_dir: str = ""                        # logs, state files, job storage
    keep_alive_minutes: float = 0.0           # default idle stop; 0 keeps the server up
    startup_timeout_s: Optional[float] = None  # None: scaled by model size
    hang_timeout_s: float = 120.0             # /health failing this long while the process lives: restart
    remote_api_keys: dict[str, str] = field(default_factory=dict, repr=False)  # URL prefix -> key
    extra_env: dict[str, str] = field(default_factory=dict)  # e.g. HF_HOME, HF_HUB_OFFLINE

    def resolved_server_command(self) -> list[str]:
        """The program that is `vllm`: explicit command, else the server venv's, else PATH."""
        if self.server_command:
            return list(self.server_command)
        if self.server_env:
            candidate = Path(self.server_env).expanduser() / "bin" / "vllm"
            if candidate.exists():
                return [str(candidate)]
            raise LauncherError(
                f"No vllm in the server environment {self.server_env}",
                f"{candidate} does not exist",
                "create it with server/create_server_env.sh, or fix VLLM_OMNI_LAUNCHER_SERVER_ENV",
                setting="server_env")
        found = shutil.which("vllm")
        if not found:
            raise LauncherError(
                "Cannot find the vLLM-Omni server program",
                "no server command or server environment is configured and `vllm` is not on PATH",
                "run server/create_server_env.sh on the GPU machine, then set VLLM_OMNI_LAUNCHER_SERVER_ENV "
                f"to its path (or 'server_env' in {CONFIG_FILE_NAME})", setting="server_env")
        return [found]

    def api_key_for(self, url: str) -> Optional[str]:
        """Key for a remote server: longest matching URL prefix, else the default key."""
        best = max((p for p in self.remote_api_keys if p != "*" and url.startswith(p)), key=len, default=None)
        if best is not None:
            return self.remote_api_keys[best]
        return self.remote_api_keys.get("*")

    def data_path(self, *parts: str) -> Path:
        path = Path(self.data_dir).expanduser().joinpath(*parts)
        path.mkdir(parents=True, exist_ok=True)
        return path


def default_data_dir() -> str:
    """Where logs, state files and job storage go when the config names no data_dir."""
    user = _comfy_user_dir()
    return str(user / "vllm_omni_launcher") if user else "~/.cache/vllm-omni-launcher"


def _comfy_user_dir() -> Optional[Path]:
    """ComfyUI's user directory, when running inside ComfyUI (lazy: CI has no ComfyUI)."""
    try:
        import folder_paths  # type: ignore[import-not-found]
    except ImportError:
        return None
    getter = getattr(folder_paths, "get_user_directory", None)
    return Path(getter()) if getter else None


def config_file_path() -> Optional[Path]:
    explicit = os.environ.get(ENV_PREFIX + "CONFIG")
    if explicit:
        return Path(explicit).expanduser()
    user = _comfy_user_dir()
    if user is not None:
        return user / CONFIG_FILE_NAME
    return Path("~/.config/vllm-omni-launcher").expanduser() / CONFIG_FILE_NAME


def load_local_config() -> LocalConfig:
    """Read the file (if any), then let environment variables override it."""
    data: dict[str, Any] = {}
    path = config_file_path()
    if path is not None and path.is_file():
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise LauncherError(f"Cannot read the launcher config {path}", str(exc),
                                "fix the JSON or delete the file") from exc
    env = os.environ
    if env.get(ENV_PREFIX + "SERVER_CMD"):
        data["server_command"] = shlex.split(env[ENV_PREFIX + "SERVER_CMD"])
    for key, conv in (("SERVER_ENV", str), ("HOST", str), ("PORT", int), ("DATA_DIR", str),
                      ("KEEP_ALIVE_MINUTES", float), ("STARTUP_TIMEOUT_S", float), ("HANG_TIMEOUT_S", float)):
        if env.get(ENV_PREFIX + key):
            data[key.lower()] = conv(env[ENV_PREFIX + key])
    if env.get(ENV_PREFIX + "TRUST_REMOTE_CODE"):
        data["trust_remote_code"] = env[ENV_PREFIX + "TRUST_REMOTE_CODE"].lower() in ("1", "true", "yes")
    keys = dict(data.get("remote_api_keys") or {})
    if env.get(ENV_PREFIX + "REMOTE_API_KEY"):
        keys["*"] = env[ENV_PREFIX + "REMOTE_API_KEY"]
    command = data.get("server_command") or ()
    if isinstance(command, str):
        command = shlex.split(command)
    default_data = default_data_dir()
    return LocalConfig(
        server_command=tuple(command),
        server_env=data.get("server_env"),
        host=data.get("host", "127.0.0.1"),
        port=data.get("port"),
        trust_remote_code=bool(data.get("trust_remote_code", False)),
        data_dir=data.get("data_dir") or default_data,
        keep_alive_minutes=float(data.get("keep_alive_minutes", 0.0)),
        startup_timeout_s=data.get("startup_timeout_s"),
        hang_timeout_s=float(data.get("hang_timeout_s") or 120.0),
        remote_api_keys=keys,
        extra_env={str(k): str(v) for k, v in (data.get("extra_env") or {}).items()},
    )
