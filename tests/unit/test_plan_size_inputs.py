"""`plan`'s size inputs: --gpu-memory, --host-ram and --batch refuse NaN, infinity, 0, negative
numbers, sizes no machine has and empty or dangling lists as usage errors (exit 2) naming the
option; without --gpu-memory, plan uses VLLM_OMNI_LAUNCHER_GPU_MEMORY_GB (as a launch does) and
says so; --no-recommend exits 3 when the given spec does not fit."""
from __future__ import annotations

import json

import pytest

from vllm_omni_launcher.cli import build_parser, main
from vllm_omni_launcher.cli.exit_codes import ExitCode
from vllm_omni_launcher.planner.gpus import MAX_GPU_GIB, parse_gpu_memory
from vllm_omni_launcher.planner.launch_plan import GPU_MEMORY_ENV

T2V = "Wan-AI/Wan2.2-T2V-A14B-Diffusers"
ULYSSES_ON_24S = ["plan", "--model", T2V, "--parallel", "ulysses=2", "--vae-patch", "2", "--no-recommend"]


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1e400", "1e9", str(MAX_GPU_GIB + 1), "0", "-5", "",
                                   "24,", ",24", "24,,24", "0x80", "2x", "lots", "99999999x80"])
def test_bad_gpu_memory_is_a_usage_error_naming_the_option(capsys, value):
    assert main(["plan", "--model", T2V, f"--gpu-memory={value}"]) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert err.startswith("error: argument --gpu-memory: ") and ("GiB" in err or "GPUs" in err)


def test_gpu_memory_sizes_within_the_cap_are_read_as_gib():
    assert parse_gpu_memory("24,24") == [24.0, 24.0]
    assert parse_gpu_memory("2x141gb") == [141.0, 141.0]
    assert parse_gpu_memory(f"{MAX_GPU_GIB:g}") == [MAX_GPU_GIB]


@pytest.mark.parametrize("option,value", [("--host-ram", "nan"), ("--host-ram", "-5"), ("--host-ram", "0"),
                                          ("--host-ram", "inf"), ("--host-ram", "1e9"), ("--batch", "0"),
                                          ("--batch", "-3"), ("--batch", "65"), ("--batch", "two")])
def test_bad_host_ram_and_batch_are_usage_errors_naming_the_option(capsys, option, value):
    assert main(["plan", "--model", T2V, "--gpu-memory", "80", f"{option}={value}"]) == ExitCode.USAGE
    assert capsys.readouterr().err.startswith(f"error: argument {option}: '{value}' is not")


def test_the_help_says_gib_and_the_no_recommend_exit_code():
    text = build_parser("plan").format_help()
    assert "GIB,GIB" in text and "sizes in GiB" in text and " GB" not in text.replace("24 GB", "")
    assert "exit 3 when it does not fit" in " ".join(text.split())


def test_no_recommend_exits_3_when_the_given_spec_does_not_fit(capsys):
    assert main([*ULYSSES_ON_24S, "--gpu-memory", "24,24"]) == ExitCode.DOES_NOT_FIT
    assert "DOES NOT FIT, headroom -49.0 GiB" in capsys.readouterr().out
    assert main([*ULYSSES_ON_24S, "--gpu-memory", "80,80", "--json"]) == ExitCode.OK


def test_plan_uses_the_gpu_memory_variable_and_says_so(monkeypatch, capsys):
    monkeypatch.setenv(GPU_MEMORY_ENV, "24,24")
    assert main(ULYSSES_ON_24S) == ExitCode.DOES_NOT_FIT
    out = capsys.readouterr().out
    assert f"note: GPU memory from {GPU_MEMORY_ENV}=24,24" in out and "24 GiB GPU" in out
    assert main([*ULYSSES_ON_24S, "--json"]) == ExitCode.DOES_NOT_FIT
    data = json.loads(capsys.readouterr().out)
    assert data["gpu_sizes_from"] == GPU_MEMORY_ENV and data["plan"]["gpus"][0]["gpu"]["total_gib"] == 24
    # --gpu-memory still wins, and the JSON says which sizes were planned for
    assert main([*ULYSSES_ON_24S, "--gpu-memory", "80,80", "--json"]) == ExitCode.OK
    assert json.loads(capsys.readouterr().out)["gpu_sizes_from"] == "--gpu-memory"


def test_a_bad_gpu_memory_variable_names_the_variable(monkeypatch, capsys):
    monkeypatch.setenv(GPU_MEMORY_ENV, "nan")
    assert main(ULYSSES_ON_24S) == ExitCode.LAUNCHER_ERROR
    err = capsys.readouterr().err
    assert f"error: {GPU_MEMORY_ENV} is not valid" in err and f"set {GPU_MEMORY_ENV} to this machine's" in err
