"""Every plan is made for the vLLM-Omni line of the server environment that will run it.

`plan`, the Local Server node's `auto` (`ServingChoice.resolve` -> `resolve_launch`, the same call
`serve` and `generate` make) and the OOM step-down it wires all take the line from the one version
check a launch makes (`versions.checked_server_version`): a 0.26 environment is planned with 0.26's
memory and speed figures, a 0.30 one with 0.30's, and the texts say which. Where `plan` cannot read
the environment it uses the pinned line and says so. The environments are fakes whose interpreter
reports a version, (fake_server_envs.py).
"""
from __future__ import annotations

import json
from types import SimpleNamespace

import psutil
import pytest

from fake_server_envs import fake_server_env, server_command
from vllm_omni_launcher.cli import main
from vllm_omni_launcher.planner.launch_plan import GPU_MEMORY_ENV, ServingChoice, resolve_launch
from vllm_omni_launcher.planner.memory import plan
from vllm_omni_launcher.planner.step_down import step_down
from vllm_omni_launcher.server.config.local_config import load_local_config
from vllm_omni_launcher.server.launch.spec import LaunchSpec

TI2V = "Wan-AI/Wan2.2-TI2V-5B-Diffusers"
GIB = 2 ** 30
# TI2V-5B's defaults on one 24 GB card, 64 GB of free RAM: what each line's figures pick (offload, VAE tiling).
# 0.26's over-predict the untiled decode and keep the text encoder on the GPU under layerwise offload;
# 0.30's were measured on 0.30 (bench/results/h200-memory-vllm-omni-0.30/).
PICK = {(0, 26): ("layerwise", True), (0, 30): ("layerwise", False)}
LINES = sorted(PICK)


@pytest.fixture()
def server_line(tmp_path, monkeypatch):
    """Make the server environment report a vLLM-Omni line, on a machine with one 24 GB GPU and 64 GB free RAM."""
    monkeypatch.setenv("VLLM_OMNI_LAUNCHER_CONFIG", str(tmp_path / "none.json"))
    monkeypatch.setenv("VLLM_OMNI_LAUNCHER_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv(GPU_MEMORY_ENV, "24")
    monkeypatch.setattr(psutil, "virtual_memory", lambda: SimpleNamespace(available=64 * GIB))

    def use(line: tuple[int, int], omni: str = "") -> None:
        vllm = f"{line[0]}.{line[1]}.0"
        monkeypatch.setenv("VLLM_OMNI_LAUNCHER_SERVER_CMD", server_command(fake_server_env(tmp_path, vllm, omni or vllm)))
    return use


def _label(line: tuple[int, int]) -> str:
    return f"vLLM-Omni {line[0]}.{line[1]}"


@pytest.mark.parametrize("line", LINES)
def test_plan_estimates_and_recommends_with_the_server_environments_line(server_line, capsys, line):
    server_line(line)
    assert main(["plan", "--model", TI2V, "--gpu-memory", "24", "--host-ram", "64", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    same = plan(LaunchSpec(model=TI2V), None, [24.0], host_available_gib=64.0, server_version=line)
    assert out["plan"]["calibration"] == _label(line) and out["recommendation"]["calibration"] == _label(line)
    assert out["plan"]["gpus"][0]["peak_gib"] == round(same.gpus[0].peak_gib, 3)
    memory = out["recommendation"]["spec"]["memory"]
    assert (memory["offload"], memory["vae_tiling"]) == PICK[line]
    assert not any("pinned" in w for w in out["warnings"])


def test_the_two_lines_really_plan_differently_here():
    """The cases above prove something only because the lines' figures differ for this request."""
    peaks = {line: plan(LaunchSpec(model=TI2V), None, [24.0], host_available_gib=64.0, server_version=line).peak_gib
             for line in LINES}
    assert peaks[(0, 26)] > peaks[(0, 30)] + 5.0 and PICK[(0, 26)] != PICK[(0, 30)]


@pytest.mark.parametrize("line", LINES)
def test_the_local_server_nodes_auto_and_its_oom_step_down_plan_with_the_server_environments_line(
        server_line, line):
    server_line(line)
    config = load_local_config()
    launch = ServingChoice().resolve(TI2V, config)           # gpus auto, parallel auto (the node's defaults)
    assert launch.server_version == line
    assert (launch.spec.memory.offload, launch.spec.memory.vae_tiling) == PICK[line]
    assert f"estimates calibrated for {_label(line)}\n" in launch.text + "\n"
    # a launch without auto: its OOM fallback steps down by the same line's figures
    fixed = resolve_launch(LaunchSpec(model=TI2V), config, gpus="0", auto_fallback=True)
    other = next(v for v in LINES if v != line)
    stepped = fixed.fallback(fixed.spec, "oom")
    assert stepped == step_down(fixed.spec, "oom", [24.0], server_version=line)
    assert stepped != step_down(fixed.spec, "oom", [24.0], server_version=other)


@pytest.mark.parametrize("command,why", [
    ("{tmp}/no-env/python", "Cannot run the server environment's python"),
    (None, "vLLM 0.26.0 and vLLM-Omni 0.30.0 do not match"),
])
def test_plan_without_a_usable_server_environment_uses_the_pinned_line_and_says_why(
        server_line, tmp_path, monkeypatch, capsys, command, why):
    if command is None:
        server_line((0, 26), omni="0.30.0")                  # a pair a launch would refuse
    else:
        monkeypatch.setenv("VLLM_OMNI_LAUNCHER_SERVER_CMD", command.format(tmp=tmp_path))
    assert main(["plan", "--model", TI2V, "--gpu-memory", "24", "--host-ram", "64"]) == 0
    out = capsys.readouterr().out
    assert "estimates calibrated for vLLM-Omni 0.30 (the pinned default: the server's version is unknown)" in out
    assert f"warning: {why}" in out and "the estimates use the figures of vLLM-Omni 0.30" in out
    assert "Recommended: 1 GPU + layerwise offload\n" in out                      # 0.30's pick
