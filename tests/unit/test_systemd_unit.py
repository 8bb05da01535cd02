"""`serve` as a systemd service: the unit it prints, the documented unit, and sd_notify.

* docs/deploy/vllm-omni-launcher.service is exactly what the unit renderer writes for the example
  machine below (so the documented file cannot drift from what `--print-systemd-unit` prints);
* `serve ... --print-systemd-unit` fills in this machine (user, python, config file, server env, data
  dir) and the options given, the key as a credential (none for `--join` / `--no-api-key`), and
  starts nothing; `systemd-analyze verify` finds nothing in it (systemd reports unit problems as
  warnings with exit 0, so any line naming the unit is a failure);
* the unit keeps the process-group contract: Type=notify, KillMode=mixed, a stop timeout above the
  launcher's own stop (server/process/timeouts.py's deadlines);
* `notify` sends one datagram to `$NOTIFY_SOCKET` (a path or an abstract name), collapses newlines,
  and is a quiet no-op without systemd or when the socket is gone.
The supervision under systemd's signals (SIGTERM to the launcher, SIGKILL to what is left) is
tests/contract/test_supervisor_lifecycle.py's serve test; a real systemd run is docs/deploy/check_systemd_unit.sh.
"""
from __future__ import annotations

import getpass
import os
import shlex
import shutil
import socket
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from vllm_omni_launcher.cli import main, serve_cmd
from vllm_omni_launcher.cli.systemd_service import UnitInputs, notify, render_unit
from vllm_omni_launcher.server.process import timeouts
from vllm_omni_launcher.errors import LauncherError
from vllm_omni_launcher.errors import config_names
from vllm_omni_launcher.server.config.local_config import load_local_config

REPO = Path(__file__).resolve().parents[2]
DOC_UNIT = REPO / "docs" / "deploy" / "vllm-omni-launcher.service"
TI2V = "Wan-AI/Wan2.2-TI2V-5B-Diffusers"

EXAMPLE = UnitInputs(
    exec_argv=["/home/vllm/vllm-omni-launcher/.venv/bin/python", "-m", "vllm_omni_launcher", "serve",
               "--model", TI2V, "--gpus", "0,1", "--replicas", "2", "--api-key-from", "%d/api-key"],
    user="vllm", group="vllm", working_directory="/home/vllm",
    environment={"PYTHONUNBUFFERED": "1",
                 "VLLM_OMNI_LAUNCHER_CONFIG": "/home/vllm/.config/vllm-omni-launcher/vllm_omni_launcher.json",
                 "VLLM_OMNI_LAUNCHER_SERVER_ENV": "/home/vllm/.local/share/vllm-omni-launcher/server-env",
                 "VLLM_OMNI_LAUNCHER_DATA_DIR": "/home/vllm/.cache/vllm-omni-launcher"},
    key_path="/etc/vllm-omni-launcher/api-key",
    description=f"vLLM-Omni Launcher: {TI2V} as a server (Wan2.2 for ComfyUI)")


def keys(unit: str) -> dict[str, list[str]]:
    """Key -> values of a unit file (comments and section headers left out)."""
    out: dict[str, list[str]] = {}
    for line in unit.splitlines():
        if line and not line.startswith(("#", "[")):
            key, _, value = line.partition("=")
            out.setdefault(key, []).append(value)
    return out


def printed_unit(capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                 *options: str) -> str:
    monkeypatch.setenv("VLLM_OMNI_LAUNCHER_CONFIG", str(tmp_path / "launcher.json"))
    monkeypatch.setenv("VLLM_OMNI_LAUNCHER_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("VLLM_OMNI_LAUNCHER_SERVER_ENV", str(tmp_path / "server-env"))
    monkeypatch.setattr(serve_cmd, "Supervisor", None)          # printing the unit must start nothing
    capsys.readouterr()
    assert main(["serve", "--model", TI2V, *options, "--print-systemd-unit"]) == 0
    return capsys.readouterr().out


def test_the_documented_unit_is_the_one_serve_prints_for_the_example_machine():
    assert DOC_UNIT.read_text() == render_unit(EXAMPLE), (
        "docs/deploy/vllm-omni-launcher.service drifted from cli/systemd_service.render_unit: rewrite it with "
        "render_unit(tests/unit/test_systemd_unit.EXAMPLE)")


def test_print_systemd_unit_fills_in_this_machine_and_the_options(capsys, tmp_path, monkeypatch):
    unit = printed_unit(capsys, tmp_path, monkeypatch, "--gpus", "0", "--accept-replicas", "29555",
                        "--extra-flag=--max-num-seqs=2")
    k = keys(unit)
    assert k["User"] == [getpass.getuser()] and k["Type"] == ["notify"] and k["KillMode"] == ["mixed"]
    assert k["ExecStart"] == [f"{sys.executable} -m vllm_omni_launcher serve --model {TI2V} --gpus 0 "
                              "--extra-flag=--max-num-seqs=2 --accept-replicas 29555 --api-key-from %d/api-key"]
    assert k["LoadCredential"] == ["api-key:/etc/vllm-omni-launcher/api-key"]
    env = dict(e.split("=", 1) for e in k["Environment"])
    assert env["VLLM_OMNI_LAUNCHER_CONFIG"] == str(tmp_path / "launcher.json")
    assert env["VLLM_OMNI_LAUNCHER_DATA_DIR"] == str(tmp_path / "data")
    assert env["VLLM_OMNI_LAUNCHER_SERVER_ENV"] == str(tmp_path / "server-env")
    assert Path(k["WorkingDirectory"][0], "vllm_omni_launcher").exists() or k["WorkingDirectory"] == [str(REPO.parent)]


def test_a_key_file_the_operator_names_becomes_the_credential(capsys, tmp_path, monkeypatch):
    unit = printed_unit(capsys, tmp_path, monkeypatch, "--api-key-from", "/srv/keys/gpu-box.key")
    k = keys(unit)
    assert k["LoadCredential"] == ["api-key:/srv/keys/gpu-box.key"]
    assert k["ExecStart"][0].endswith("--api-key-from %d/api-key") and "/srv/keys" not in k["ExecStart"][0]


def test_the_units_environment_read_back_is_this_commands_config(capsys, tmp_path, monkeypatch):
    """The variables the unit sets are the ones the config reads (named from the settings' declarations)."""
    monkeypatch.setenv("VLLM_OMNI_LAUNCHER_SERVER_CMD", "'/opt/vllm env/bin/vllm' --flag")
    monkeypatch.setenv("VLLM_OMNI_LAUNCHER_GPU_LOCK_DIR", str(tmp_path / "locks"))
    words = keys(printed_unit(capsys, tmp_path, monkeypatch))["Environment"]
    env = dict(shlex.split(word)[0].split("=", 1) for word in words)     # a quoted one: "NAME=a value"
    service = load_local_config(env)
    assert env[config_names.CONFIG_VAR] == str(tmp_path / "launcher.json")
    assert service.server_command == ("/opt/vllm env/bin/vllm", "--flag")
    assert (service.data_dir, service.gpu_lock_dir) == (str(tmp_path / "data"), str(tmp_path / "locks"))


@pytest.mark.parametrize("options", [("--join", "10.0.0.5:29555"), ("--no-api-key",)])
def test_a_keyless_serve_gets_no_credential(capsys, tmp_path, monkeypatch, options):
    k = keys(printed_unit(capsys, tmp_path, monkeypatch, *options))
    assert "LoadCredential" not in k and "--api-key-from" not in k["ExecStart"][0]
    assert " ".join(options) in k["ExecStart"][0]


def test_the_unit_keeps_the_process_group_contract():
    k = keys(render_unit(EXAMPLE))
    assert k["KillMode"] == ["mixed"] and k["KillSignal"] == ["SIGTERM"] and k["NotifyAccess"] == ["main"]
    # the launcher's stop (a cancelled start's replace, then the supervisor's stop), with room
    assert int(k["TimeoutStopSec"][0].rstrip("s")) >= 2 * (timeouts.REPLACE_STOP_S + timeouts.STOP_S)
    assert k["Restart"] == ["on-failure"] and k["RestartPreventExitStatus"] == ["2"]
    assert k["StandardOutput"] == ["journal"] and k["StandardError"] == ["journal"]


def test_words_systemd_would_expand_are_kept_literal():
    unit = render_unit(UnitInputs(exec_argv=["/opt/py", "-m", "vllm_omni_launcher", "serve", "--served-model-name",
                                             "wan 100% $HOME \"x\"", "--api-key-from", "%d/api-key"],
                                  user="u", group="g", working_directory="/opt/50%",
                                  environment={"HF_HOME": "/data/hf cache/$x"}))
    k = keys(unit)
    assert k["ExecStart"] == ['/opt/py -m vllm_omni_launcher serve --served-model-name '
                              '"wan 100%% $$HOME \\"x\\"" --api-key-from %d/api-key']
    assert k["WorkingDirectory"] == ["/opt/50%%"] and k["Environment"] == ['"HF_HOME=/data/hf cache/$x"']


def test_systemd_analyze_verify_finds_nothing_in_the_printed_unit(capsys, tmp_path, monkeypatch):
    unit = printed_unit(capsys, tmp_path, monkeypatch, "--gpus", "0")
    path = tmp_path / "vllm-omni-launcher.service"
    path.write_text(unit)
    tool = shutil.which("systemd-analyze")
    if tool is None:
        warnings.warn("systemd-analyze is not installed here: only the unit's own checks ran (install systemd to "
                      "verify the unit)")
        assert set(keys(unit)) >= {"Type", "ExecStart", "KillMode", "User", "Restart"}
        return
    out = subprocess.run([tool, "verify", "--man=no", str(path)], capture_output=True, text=True, timeout=120)
    findings = [line for line in (out.stdout + out.stderr).splitlines() if path.name in line]
    assert out.returncode == 0 and not findings, out.stdout + out.stderr


# ---- reading the key a credential holds --------------------------------------------------------
def test_the_key_file_is_read_when_only_its_owner_can_read_it(tmp_path):
    key = tmp_path / "api-key"
    key.write_text("  k3y-0123456789abcdef\n")
    key.chmod(0o400)
    assert serve_cmd.read_key_file(str(key)) == "k3y-0123456789abcdef"


@pytest.mark.parametrize("content, mode, words", [
    ("k3y-0123456789abcdef", 0o644, "readable by other users"),
    ("short", 0o600, "at least 16"),
    ("two words 0123456789abcdef", 0o600, "without spaces"),
])
def test_a_key_file_others_can_read_or_without_one_key_is_refused(tmp_path, content, mode, words):
    key = tmp_path / "api-key"
    key.write_text(content)
    key.chmod(mode)
    with pytest.raises(LauncherError) as err:
        serve_cmd.read_key_file(str(key))
    assert err.value.setting == "--api-key-from" and words in f"{err.value.what} {err.value.why}"


def test_a_key_file_reached_through_a_link_is_refused(tmp_path):
    real = tmp_path / "real"
    real.write_text("k3y-0123456789abcdef")
    real.chmod(0o600)
    (tmp_path / "link").symlink_to(real)
    with pytest.raises(LauncherError) as err:
        serve_cmd.read_key_file(str(tmp_path / "link"))
    assert "symbolic link" in err.value.why


# ---- sd_notify ---------------------------------------------------------------------------------
@pytest.mark.parametrize("abstract", [False, True])
def test_notify_sends_one_datagram_to_the_notify_socket(tmp_path, abstract):
    name = f"@vllm-omni-test-{os.getpid()}" if abstract else str(tmp_path / "notify")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name[1:] if abstract else name)
        sock.settimeout(5)
        assert notify("READY=1", "STATUS=Ready: a\nmulti-line text", environ={"NOTIFY_SOCKET": name})
        assert sock.recv(4096) == b"READY=1\nSTATUS=Ready: a multi-line text"


def test_notify_without_systemd_or_with_the_socket_gone_does_nothing(tmp_path):
    assert notify("READY=1", environ={}) is False
    assert notify("READY=1", environ={"NOTIFY_SOCKET": str(tmp_path / "gone")}) is False
    assert notify("READY=1", environ={"NOTIFY_SOCKET": "vsock:2:9999"}) is False


def test_notify_never_waits_for_a_reader_that_does_not_read(tmp_path):
    path = str(tmp_path / "notify")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(path)
        sent = [notify(f"STATUS=phase {i}", environ={"NOTIFY_SOCKET": path}) for i in range(2000)]
    assert sent[0] and not all(sent)        # the queue filled up, and every call still returned
