"""The names the local configuration is known by: its file, its variables, and the reserved ones.

Every layer's messages name them ("set VLLM_OMNI_LAUNCHER_DATA_DIR", "in ~/.config/.../
vllm_omni_launcher.json"), the client's included, so they live below the client; what the
settings are and how they are read is server/config/local_config.py.

Where the file is must not depend on the current directory: the core never imports ComfyUI
(`folder_paths` is importable from any Python started inside a ComfyUI checkout, so asking it
would make `python -m vllm_omni_launcher ...` read another file there than elsewhere). ComfyUI's
user directory counts only once the pack's ComfyUI entry point registers it
(`use_comfy_user_dir`); the command line always uses ~/.config, unless VLLM_OMNI_LAUNCHER_CONFIG
names another file.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Optional

ENV_PREFIX = "VLLM_OMNI_LAUNCHER_"                  # every launcher setting's variable starts so
API_KEY_VAR = "VLLM_API_KEY"                        # the per-launch key, in the server's environment only
CONFIG_FILE_NAME = "vllm_omni_launcher.json"
CLI_CONFIG_DIR = "~/.config/vllm-omni-launcher"     # the file's folder outside ComfyUI


def env_var(name: str, env: str = "") -> str:
    """The variable that sets the launcher setting `name`: the prefix, then `env` (a setting's
    declared variable name, e.g. SERVER_CMD) or else `name` upper-cased. The one spelling of the
    rule: the config reads its variables by it and every message names them by it."""
    return ENV_PREFIX + (env or name.upper())


CONFIG_VAR = env_var("config")                      # the config file's path (no setting: it names the file)
REMOTE_URL_VAR = env_var("remote_url")              # one remote server named by the environment
REMOTE_KEY_VAR = env_var("remote_api_key")          # ... and its key

_comfy_user_dir: Optional[Path] = None


def is_reserved_name(name: str) -> bool:
    """Variables no server may receive from ComfyUI or the operator's extra_env: the launcher's
    own settings (they hold its remote keys) and VLLM_API_KEY (each launch makes its own)."""
    upper = name.upper()
    return upper == API_KEY_VAR or upper.startswith(ENV_PREFIX)


def use_comfy_user_dir(path: Optional[str]) -> None:
    """Called by the pack's ComfyUI entry point with ComfyUI's user directory: from then on this
    process keeps its config file and data there. Nothing else sets it (see the module docstring)."""
    global _comfy_user_dir  # noqa: PLW0603 - one per process: the ComfyUI that loaded the pack
    _comfy_user_dir = Path(path) if path else None


def comfy_user_dir() -> Optional[Path]:
    """ComfyUI's user directory when ComfyUI loaded the pack in this process (use_comfy_user_dir), else None."""
    return _comfy_user_dir


def config_file_path(environ: Optional[Mapping[str, str]] = None) -> Path:
    """The config file: VLLM_OMNI_LAUNCHER_CONFIG, else ComfyUI's user dir (when ComfyUI loaded the
    pack), else ~/.config/vllm-omni-launcher."""
    explicit = (os.environ if environ is None else environ).get(CONFIG_VAR)
    if explicit:
        return Path(explicit).expanduser()
    user = comfy_user_dir()
    if user is not None:
        return user / CONFIG_FILE_NAME
    return Path(CLI_CONFIG_DIR).expanduser() / CONFIG_FILE_NAME
