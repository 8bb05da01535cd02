"""Where the config file and the data dir are does not depend on the current directory: the core never
asks ComfyUI (a `folder_paths` importable because the command line runs inside a ComfyUI checkout
changes nothing), and ComfyUI's user directory counts only once the pack's ComfyUI entry registers it
(nodes/comfy_bridge.register_user_directory, called by comfy_entrypoint)."""
from __future__ import annotations

import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from vllm_omni_launcher.errors import config_names
from vllm_omni_launcher.nodes import comfy_bridge
from vllm_omni_launcher.server.config import local_config

TI2V = "Wan-AI/Wan2.2-TI2V-5B-Diffusers"


def _fake_comfyui(root: Path) -> Path:
    """A ComfyUI checkout's top: its folder_paths module, and a user/ dir holding a broken config file
    (reading it would stop any command)."""
    (root / "user").mkdir(parents=True)
    (root / "user" / config_names.CONFIG_FILE_NAME).write_text("{ not json")
    (root / "folder_paths.py").write_text(f"def get_user_directory():\n    return {str(root / 'user')!r}\n")
    return root


@pytest.fixture
def no_registered_dir(monkeypatch):
    monkeypatch.setattr(config_names, "_comfy_user_dir", None)     # as after a fresh import
    monkeypatch.delenv(config_names.CONFIG_VAR, raising=False)
    monkeypatch.delenv("VLLM_OMNI_LAUNCHER_DATA_DIR", raising=False)


def test_the_cli_run_inside_a_comfyui_checkout_uses_the_documented_default(tmp_path):
    comfy = _fake_comfyui(tmp_path / "ComfyUI")
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if not k.startswith(config_names.ENV_PREFIX)}
    env.update(HOME=str(home), XDG_DATA_HOME=str(home / ".local" / "share"))
    # `-m` puts the current directory (the checkout) first on sys.path: folder_paths is importable there.
    out = subprocess.run([sys.executable, "-m", "vllm_omni_launcher", "serve", "--model", TI2V,
                          "--print-systemd-unit"], cwd=comfy, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    unit = dict(line.removeprefix("Environment=").split("=", 1) for line in out.stdout.splitlines()
                if line.startswith("Environment="))
    assert unit[config_names.CONFIG_VAR] == str(home / ".config" / "vllm-omni-launcher" / config_names.CONFIG_FILE_NAME)
    assert unit[local_config.setting_env_var("data_dir")] == str(home / ".cache" / "vllm-omni-launcher")


def test_an_importable_folder_paths_does_not_move_the_config(tmp_path, monkeypatch, no_registered_dir):
    monkeypatch.syspath_prepend(str(_fake_comfyui(tmp_path / "ComfyUI")))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert config_names.config_file_path() == tmp_path / "home" / ".config" / "vllm-omni-launcher" / \
        config_names.CONFIG_FILE_NAME
    assert local_config.load_local_config().data_dir == "~/.cache/vllm-omni-launcher"


def test_the_nodes_use_the_user_dir_comfyui_registers(tmp_path, monkeypatch, no_registered_dir):
    user = tmp_path / "ComfyUI" / "user"
    user.mkdir(parents=True)
    (user / config_names.CONFIG_FILE_NAME).write_text('{"port": 8123}')
    monkeypatch.setitem(sys.modules, "folder_paths", types.SimpleNamespace(get_user_directory=lambda: str(user)))
    comfy_bridge.register_user_directory()
    assert config_names.config_file_path() == user / config_names.CONFIG_FILE_NAME
    config = local_config.load_local_config()
    assert config.port == 8123 and config.data_dir == str(user / "vllm_omni_launcher")
    # VLLM_OMNI_LAUNCHER_CONFIG still wins, for the nodes too.
    monkeypatch.setenv(config_names.CONFIG_VAR, str(tmp_path / "elsewhere.json"))
    assert config_names.config_file_path() == tmp_path / "elsewhere.json"


def test_outside_comfyui_registering_finds_nothing_and_changes_nothing(monkeypatch, no_registered_dir):
    monkeypatch.setitem(sys.modules, "folder_paths", None)          # `import folder_paths` fails
    comfy_bridge.register_user_directory()
    assert config_names.comfy_user_dir() is None
