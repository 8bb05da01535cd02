"""The setup command every "cannot find the server" message prints is one this machine can run: the
running interpreter's `-m vllm_omni_launcher setup` where that package is importable, else bash on the
pack's own create_server_env.sh (a ComfyUI-Manager install has no `pip install -e`, so `python -m
vllm_omni_launcher` would stop with "No module named vllm_omni_launcher" there). The pack is loaded the
way ComfyUI loads a custom node (its folder's __init__.py under the folder's name, entered in
sys.modules), which must not count as importable."""
from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_omni_launcher.errors import LauncherError
from vllm_omni_launcher.server.config import server_env
from vllm_omni_launcher.server.config.local_config import LocalConfig

PACK = Path(server_env.__file__).resolve().parents[2]

# Loads the pack as ComfyUI's load_custom_node does, then prints the command it would tell the user.
AS_COMFYUI_LOADS_IT = f"""
import importlib.util, sys
spec = importlib.util.spec_from_file_location("vllm_omni_launcher", {str(PACK / "__init__.py")!r})
module = importlib.util.module_from_spec(spec)
sys.modules["vllm_omni_launcher"] = module
spec.loader.exec_module(module)
from vllm_omni_launcher.server.config.server_env import SETUP_COMMAND
print(SETUP_COMMAND)
"""


def _python(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_without_the_package_installed_the_command_is_the_packs_script(tmp_path):
    # -S: no site-packages, so no `pip install -e` either: the interpreter ComfyUI-Manager leaves behind.
    assert "No module named vllm_omni_launcher" in _python("-S", "-m", "vllm_omni_launcher", cwd=tmp_path).stderr
    out = _python("-S", "-c", AS_COMFYUI_LOADS_IT, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    printed = out.stdout.strip()
    assert printed == f"bash {shlex.quote(str(PACK / 'server' / 'create_server_env.sh'))}"
    usage = subprocess.run([*shlex.split(printed), "--help"], capture_output=True, text=True, timeout=60)
    assert usage.returncode == 0 and "usage: server/create_server_env.sh [PATH]" in usage.stdout


def test_with_the_package_installed_the_command_names_this_interpreter(tmp_path):
    out = _python("-c", AS_COMFYUI_LOADS_IT, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    printed = out.stdout.strip()
    assert printed == f"{shlex.quote(sys.executable)} -m vllm_omni_launcher setup"
    runs = subprocess.run([*shlex.split(printed), "--help"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    assert runs.returncode == 0 and "--path" in runs.stdout, runs.stderr


def test_a_target_folder_is_passed_the_way_each_command_takes_it():
    script = shlex.quote(str(server_env.SETUP_SCRIPT))
    assert server_env.setup_command("/srv/my env", importable=False) == f"bash {script} '/srv/my env'"
    assert (server_env.setup_command("/srv/env", importable=True)
            == f"{shlex.quote(sys.executable)} -m vllm_omni_launcher setup --path /srv/env")


def test_a_configured_server_env_without_vllm_names_the_repair_for_that_folder(tmp_path):
    with pytest.raises(LauncherError) as err:
        LocalConfig(server_env=str(tmp_path / "empty")).resolved_server_command()
    assert f"`{server_env.setup_command(str(tmp_path / 'empty'))}`" in err.value.fix
    assert "VLLM_OMNI_LAUNCHER_SERVER_ENV" in err.value.fix and err.value.setting == "server_env"
