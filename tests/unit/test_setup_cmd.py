"""`setup` and the default server environment: found without settings, explicit settings win, every
"cannot find the server" names the setup command, and `setup` leaves a good environment alone,
runs create_server_env.sh with the right arguments where one is needed, and checks the result
(the vllm / vllm-omni pair, torch and the GPUs it sees) in the real pinned server environment."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_omni_launcher.cli import main, setup_cmd
from vllm_omni_launcher.cli.exit_codes import ExitCode
from vllm_omni_launcher.errors import LauncherError
from vllm_omni_launcher.planner.doctor_env import check_server_env
from vllm_omni_launcher.planner.doctor_report import UNCHECKED
from vllm_omni_launcher.server.config.local_config import LocalConfig
from vllm_omni_launcher.server.config.server_env import SETUP_COMMAND, default_server_env

SETUP = f"{sys.executable} -m vllm_omni_launcher setup"   # the tests' venv has the package installed (-e)


@pytest.fixture(autouse=True)
def _own_data_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The default server env goes under a fresh XDG_DATA_HOME; nothing else points at a server."""
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "share"))
    monkeypatch.delenv("VLLM_OMNI_LAUNCHER_SERVER_ENV", raising=False)
    monkeypatch.delenv("VLLM_OMNI_LAUNCHER_SERVER_CMD", raising=False)


def _make_env(path: Path) -> Path:
    (path / "bin").mkdir(parents=True)
    vllm = path / "bin" / "vllm"
    vllm.write_text("#!/bin/sh\n")
    vllm.chmod(0o755)
    return vllm


def _installer(tmp_path: Path, then: str) -> Path:
    """A stand-in for create_server_env.sh: records its arguments, one a line, then runs `then`."""
    script = tmp_path / "installer.sh"
    script.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > "{tmp_path}/installer-args"\n{then}\n')
    return script


def _installer_args(tmp_path: Path) -> list[str]:
    return (tmp_path / "installer-args").read_text().splitlines()


# ---- where the server program is -------------------------------------------------------------
def test_the_default_server_env_is_found_without_any_setting_before_path(tmp_path, monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: "/usr/local/bin/vllm")
    assert default_server_env() == tmp_path / "share" / "vllm-omni-launcher" / "server-env"
    vllm = _make_env(default_server_env())
    assert LocalConfig().resolved_server_command() == [str(vllm)]


def test_explicit_settings_win_over_the_default_server_env(tmp_path):
    _make_env(default_server_env())
    mine = _make_env(tmp_path / "mine")
    assert LocalConfig(server_env=str(tmp_path / "mine")).resolved_server_command() == [str(mine)]
    assert LocalConfig(server_command=("/opt/env/bin/vllm",)).resolved_server_command() == ["/opt/env/bin/vllm"]
    with pytest.raises(LauncherError) as err:      # a configured env without vllm never falls back silently
        LocalConfig(server_env=str(tmp_path / "empty")).resolved_server_command()
    assert f"{SETUP} --path {tmp_path / 'empty'}" in err.value.fix and err.value.setting == "server_env"


def test_path_is_used_when_the_default_server_env_is_absent(monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: "/somewhere/bin/vllm" if name == "vllm" else None)
    assert LocalConfig().resolved_server_command() == ["/somewhere/bin/vllm"]


def test_cannot_find_the_server_prints_the_setup_command_in_config_and_doctor(monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    assert SETUP_COMMAND == SETUP
    with pytest.raises(LauncherError) as err:
        LocalConfig().resolved_server_command()
    assert err.value.what == "Cannot find the vLLM-Omni server program"
    assert f"`{SETUP}`" in err.value.fix and str(default_server_env()) in err.value.fix
    checks, _env = check_server_env(LocalConfig(), subprocess.run, 5.0)
    assert checks[0].status == UNCHECKED and f"`{SETUP}`" in checks[0].fix


@pytest.mark.parametrize("xdg", [True, False])
def test_create_server_env_sh_uses_the_same_default_location(tmp_path, monkeypatch, xdg):
    """The script's own 'already installed' check runs the env's python: one that answers yes stands in."""
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path / "home")}
    if xdg:
        env["XDG_DATA_HOME"] = str(tmp_path / "share")
    else:
        monkeypatch.delenv("XDG_DATA_HOME")
        monkeypatch.setenv("HOME", env["HOME"])
    target = default_server_env()
    assert target == (tmp_path / "share" if xdg else tmp_path / "home" / ".local" / "share") \
        / "vllm-omni-launcher" / "server-env"
    (target / "bin").mkdir(parents=True)
    (target / "bin" / "python").write_text("#!/bin/sh\nexit 0\n")
    (target / "bin" / "python").chmod(0o755)
    out = subprocess.run(["bash", str(setup_cmd.CREATE_SCRIPT)], env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert f"server env at {target} already has vllm==0.30.0 and vllm-omni==0.30.0" in out.stdout


# ---- setup -------------------------------------------------------------------------------------
def test_installer_argv_passes_path_version_and_python():
    script = setup_cmd.CREATE_SCRIPT
    assert setup_cmd.PINNED_RELEASE == "0.30.0"
    assert setup_cmd.installer_argv(Path("/x/env"), "0.30.0", None) == ["bash", str(script), "/x/env",
                                                                         "--version", "0.30.0"]
    assert setup_cmd.installer_argv(Path("/x/env"), "0.26.0", "python3.11")[-4:] == [
        "--version", "0.26.0", "--python", "python3.11"]


def test_setup_on_an_empty_dir_runs_the_installer_with_the_right_arguments(tmp_path, monkeypatch, capfd):
    monkeypatch.setattr(setup_cmd, "CREATE_SCRIPT", _installer(tmp_path, "echo no network >&2; exit 3"))
    target = tmp_path / "new-env"
    assert main(["setup", "--path", str(target), "--version", "0.26.0", "--python", "python3.12"]) \
        == ExitCode.LAUNCHER_ERROR
    assert _installer_args(tmp_path) == [str(target), "--version", "0.26.0", "--python", "python3.12"]
    err = capfd.readouterr().err            # the installer's own output reaches stderr (fd 2) as it runs
    assert "no network" in err and "installing vllm==0.26.0 + vllm-omni==0.26.0" in err
    assert f"Setting up the server environment at {target} failed" in err and "exited with code 3" in err
    assert f"`{SETUP}` again" in err


def test_setup_without_path_works_on_the_default_server_env(tmp_path, monkeypatch):
    monkeypatch.setattr(setup_cmd, "CREATE_SCRIPT", _installer(tmp_path, "exit 3"))
    assert main(["setup"]) == ExitCode.LAUNCHER_ERROR
    assert _installer_args(tmp_path) == [str(default_server_env()), "--version", "0.30.0"]


def _torch_device_count(python: str) -> int:
    out = subprocess.run([python, "-c", "import torch; print(torch.cuda.device_count())"], capture_output=True,
                         text=True, timeout=180, check=True)
    return int(out.stdout.split()[-1])


def test_setup_on_the_real_pinned_env_says_ready_and_installs_nothing(server_env_python, tmp_path, monkeypatch,
                                                                       capsys):
    monkeypatch.setattr(setup_cmd, "CREATE_SCRIPT", _installer(tmp_path, "exit 3"))
    target = Path(server_env_python).parent.parent.absolute()
    assert main(["setup", "--path", str(target)]) == ExitCode.OK
    assert not (tmp_path / "installer-args").exists()
    out = capsys.readouterr().out
    assert f"server environment already ready: {target}" in out
    assert "vllm 0.30.0 + vllm-omni 0.30.0" in out and "torch 2.13" in out
    assert f"torch.cuda.device_count() = {_torch_device_count(server_env_python)}" in out
    assert f"export VLLM_OMNI_LAUNCHER_SERVER_ENV={target}" in out
    assert f"next: open a template in ComfyUI, or {sys.executable} -m vllm_omni_launcher generate" in out


def test_setup_runs_the_installer_then_checks_what_it_made(server_env_python, tmp_path, monkeypatch, capsys):
    """The stand-in installer makes an env whose python is the real pinned one, so the check is real."""
    make = (f'mkdir -p "$1/bin"\nprintf \'#!/bin/sh\\nexec "{server_env_python}" "$@"\\n\' > "$1/bin/python"\n'
            'cp "$1/bin/python" "$1/bin/vllm"\nchmod +x "$1/bin/python" "$1/bin/vllm"')
    monkeypatch.setattr(setup_cmd, "CREATE_SCRIPT", _installer(tmp_path, make))
    assert main(["setup"]) == ExitCode.OK
    target = default_server_env()
    assert _installer_args(tmp_path) == [str(target), "--version", "0.30.0"]
    out = capsys.readouterr().out
    assert f"server environment created: {target}" in out and "vllm 0.30.0 + vllm-omni 0.30.0" in out
    assert "the launcher finds it here by itself" in out
    assert LocalConfig().resolved_server_command() == [str(target / "bin" / "vllm")]


def test_create_server_env_sh_has_uv_compile_bytecode_during_setup(tmp_path):
    """uv leaves packages uncompiled unless asked (pip compiles by default): without it the server's first
    start compiles vllm / vllm-omni / torch on import, inside Local Server's wait. A stand-in `uv` records
    its arguments and makes the venv's python."""
    log, fake_bin, target = tmp_path / "uv-args", tmp_path / "bin", tmp_path / "server-env"
    fake_bin.mkdir()
    (fake_bin / "uv").write_text(
        "#!/bin/sh\n"
        f'echo "$*" >> {log}\n'
        'if [ "$1" = venv ]; then for a; do last="$a"; done; mkdir -p "$last/bin";'
        ' printf "#!/bin/sh\\necho fake python\\n" > "$last/bin/python"; chmod +x "$last/bin/python"; fi\n')
    (fake_bin / "uv").chmod(0o755)
    env = {"PATH": f"{fake_bin}:{os.environ['PATH']}", "HOME": str(tmp_path / "home")}
    out = subprocess.run(["bash", str(setup_cmd.CREATE_SCRIPT), str(target), "--python", sys.executable],
                         env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    install = [line for line in log.read_text().splitlines() if line.startswith("pip install")]
    assert install == ["pip install --compile-bytecode vllm==0.30.0 vllm-omni==0.30.0"]
