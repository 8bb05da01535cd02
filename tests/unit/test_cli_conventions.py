"""CLI conventions: --version, one exit code per outcome, JSON errors under --json, a deterministic
`argv`, results on stdout and progress on stderr, and help text on every option."""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_omni_launcher import cli
from vllm_omni_launcher.cli import COMMANDS, build_parser, main
from vllm_omni_launcher.cli import argv_cmd, version as version_mod
from vllm_omni_launcher.cli.exit_codes import MEANING, ExitCode
from vllm_omni_launcher.cli.report import ERROR_FIELDS

T2V = "Wan-AI/Wan2.2-T2V-A14B-Diffusers"
PYPROJECT = Path(cli.__file__).resolve().parent.parent / "pyproject.toml"


def _pyproject_version() -> str:
    project = PYPROJECT.read_text().split("[project]", 1)[1]
    return re.search(r'(?m)^version\s*=\s*"([^"]+)"', project).group(1)


# ---- --version ------------------------------------------------------------------------
def test_version_prints_the_package_version_and_exits_0(capsys):
    assert main(["--version"]) == 0
    out = capsys.readouterr().out.strip()
    assert out == f"python -m vllm_omni_launcher {_pyproject_version()}"


def test_version_falls_back_to_pyproject_without_installed_metadata(monkeypatch):
    def missing(name: str) -> str:
        raise version_mod.PackageNotFoundError(name)

    monkeypatch.setattr(version_mod, "version", missing)
    assert version_mod.package_version() == _pyproject_version()


# ---- exit codes -----------------------------------------------------------------------
def test_exit_codes_are_distinct_and_each_is_documented_in_help(capsys):
    assert len({int(c) for c in ExitCode}) == len(ExitCode) and set(MEANING) == set(ExitCode)
    for command in (None, *COMMANDS):
        text = build_parser(command).format_help()
        for code, meaning in MEANING.items():
            assert f"{int(code):>3}  {meaning}" in text, (command, code)


def test_usage_error_exits_2_with_usage_on_stderr(capsys):
    assert main(["argv", "--model", T2V, "--offload", "bogus"]) == ExitCode.USAGE
    captured = capsys.readouterr()
    assert captured.out == "" and "usage:" in captured.err and "invalid choice: 'bogus'" in captured.err
    assert main(["no-such-command"]) == ExitCode.USAGE


def test_launcher_error_exits_1_as_what_why_fix_on_stderr(capsys):
    assert main(["argv", "--model", T2V, "--parallel", "cfg=3"]) == ExitCode.LAUNCHER_ERROR
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("error: CFG parallel degree 3 is not 2.") and "Fix: " in captured.err


def test_an_unexpected_exception_exits_70_with_its_traceback(capsys, monkeypatch):
    def broken(args: argparse.Namespace) -> int:
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(argv_cmd, "run", broken)
    assert main(["argv", "--model", T2V, "--json"]) == ExitCode.INTERNAL
    captured = capsys.readouterr()
    assert "Traceback" in captured.err and "ZeroDivisionError" in captured.err
    assert json.loads(captured.out)["error"]["kind"] == "internal"


def test_ctrl_c_exits_130(capsys, monkeypatch):
    def interrupted(args: argparse.Namespace) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(argv_cmd, "run", interrupted)
    assert main(["argv", "--model", T2V]) == ExitCode.INTERRUPTED
    assert "Interrupted" in capsys.readouterr().err


# ---- JSON errors ----------------------------------------------------------------------
def _json_error(capsys) -> dict:
    captured = capsys.readouterr()
    data = json.loads(captured.out)        # stdout is exactly one JSON object
    assert set(data) == {"error"} and set(data["error"]) == set(ERROR_FIELDS)
    return data["error"]


@pytest.mark.parametrize("argv, what, setting", [
    (["argv", "--model", T2V, "--extra-flag=--model-type=wan2_2", "--json"], "--model-type does not exist",
     "extra_flags"),
    (["plan", "--model", T2V, "--frames", "80", "--gpu-memory", "80", "--json"], "frames 80 is not valid", "frames"),
    (["plan", "--model", T2V, "--parallel", "cfg=3", "--no-recommend", "--gpu-memory", "80,80", "--json"],
     "CFG parallel degree 3 is not 2", "parallel_degree"),
])
def test_launcher_errors_under_json_are_json_on_stdout(capsys, argv, what, setting):
    assert main(argv) == ExitCode.LAUNCHER_ERROR
    err = _json_error(capsys)
    assert what in err["what"] and err["setting"] == setting and err["fix"]


def test_doctor_json_reports_an_unreadable_config_as_json(tmp_path, monkeypatch, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    monkeypatch.setenv("VLLM_OMNI_LAUNCHER_CONFIG", str(bad))
    assert main(["doctor", "--json"]) == ExitCode.LAUNCHER_ERROR
    err = _json_error(capsys)
    assert str(bad) in err["what"] and err["fix"]


@pytest.mark.parametrize("command", ["argv", "plan", "doctor"])
def test_usage_errors_under_json_are_json_too(capsys, command):
    assert main([command, "--model", T2V, "--no-such-option", "--json"]) == ExitCode.USAGE
    err = _json_error(capsys)
    assert err["kind"] == "usage" and "--no-such-option" in err["what"] and f"{command} --help" in err["fix"]


def test_server_text_in_a_json_error_loses_its_terminal_escapes():
    from vllm_omni_launcher.cli.report import error_json
    from vllm_omni_launcher.errors import LauncherError

    err = error_json(LauncherError("x", raw="\x1b[2Jcleared\x1b]0;title\x07 screen"))["error"]
    assert err["raw"] == "cleared screen"


def test_plan_that_does_not_fit_is_a_result_with_exit_3_not_an_error(capsys):
    rc = main(["plan", "--model", T2V, "--gpu-memory", "24,24", "--host-ram", "48", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == ExitCode.DOES_NOT_FIT and "error" not in out
    assert out["recommendation"]["spec"] is None and out["recommendation"]["reason"]


# ---- argv: deterministic ---------------------------------------------------------------
def _argv_cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    import os

    return subprocess.run([sys.executable, "-m", "vllm_omni_launcher", "argv", "--model", T2V, *args],
                          capture_output=True, text=True, timeout=120, env={**os.environ, **(env or {})})


def test_argv_prints_the_same_command_on_every_call_with_a_placeholder_port():
    first, second = _argv_cli(), _argv_cli()
    assert first.returncode == second.returncode == 0
    assert first.stdout == second.stdout
    assert first.stdout.count("\n") == 1 and first.stdout.rstrip().endswith("--port 8091")
    assert "8091 is shown; a launch picks a free port" in first.stderr


def test_argv_json_marks_the_placeholder_and_uses_a_configured_port(capsys, monkeypatch):
    assert main(["argv", "--model", T2V, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["argv"][-2:] == ["--port", "8091"] and shown["port_placeholder"] is True
    monkeypatch.setenv("VLLM_OMNI_LAUNCHER_PORT", "9123")
    assert main(["argv", "--model", T2V, "--json"]) == 0
    captured = capsys.readouterr()
    shown = json.loads(captured.out)
    assert shown["argv"][-2:] == ["--port", "9123"] and shown["port_placeholder"] is False
    assert "8091" not in captured.err
    assert main(["argv", "--model", T2V, "--port", "9200", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["argv"][-2:] == ["--port", "9200"]


# ---- help on every option ---------------------------------------------------------------
@pytest.mark.parametrize("command", [None, *COMMANDS])
def test_every_option_has_help_text(command):
    parser = build_parser(command)
    missing = [a.option_strings or a.dest for a in parser._actions
               if not a.help or a.help == argparse.SUPPRESS]
    assert not missing, missing
