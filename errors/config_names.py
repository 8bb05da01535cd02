"""The names the local configuration is known by: its file, its variables, and the reserved ones.

Every layer's messages name them ("set VLLM_OMNI_LAUNCHER_DATA_DIR", "in ~/.config/.../
vllm_omni_launcher.json"), the client's included, so they live below the client; what the
settings are and how they are read is server/config/local_config.py.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Optional

ENV_PREFIX = "VLLM_OMNI_LAUNCHER_"                  # every launcher setting's variable starts so
API_KEY_VAR = "VLLM_API_KEY"                        # the per-launch key, in the server's environment only
CONFIG_FILE_NAME = "vllm_omni_launcher.json"
REMOTE_URL_VAR = ENV_PREFIX + "REMOTE_URL"          # one remote server named by the environment
REMOTE_KEY_VAR = ENV_PREFIX + "REMOTE_API_KEY"      # ... and its key


def is_reserved_name(name: str) -> bool:
    """Variables no server may receive from ComfyUI or the operator's extra_env: the launcher's
    own settings (they hold its remote keys) and VLLM_API_KEY (each launch makes its own)."""
    upper = name.upper()
    return upper == API_KEY_VAR or upper.startswith(ENV_PREFIX)


def comfy_user_dir() -> Optional[Path]:
    """ComfyUI's user directory, when running inside ComfyUI (lazy: CI has no ComfyUI)."""
    try:
        import folder_paths  # type: ignore[import-not-found]
    except ImportError:
        return None
    getter = getattr(folder_paths, "get_user_directory", None)
    return Path(getter()) if getter else None


def config_file_path(environ: Optional[Mapping[str, str]] = None) -> Optional[Path]:
    """The config file: VLLM_OMNI_LAUNCHER_CONFIG, else ComfyUI's user dir, else ~/.config."""
    explicit = (os.environ if environ is None else environ).get(ENV_PREFIX + "CONFIG")
    if explicit:
        return Path(explicit).expanduser()
    user = comfy_user_dir()
    if user is not None:
        return user / CONFIG_FILE_NAME
    return Path("~/.config/vllm-omni-launcher").expanduser() / CONFIG_FILE_NAME
