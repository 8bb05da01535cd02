"""Explicit serving settings (not `auto`) are checked against the known GPU sizes before a launch:
a load more than 10% over the card (beyond the memory plan's measured error) is refused before
anything starts, naming the peak, the card and the widgets to change; a smaller misfit is one of
the plan's warnings (not its text), which the Local Server node shows; `argv`, which starts nothing, only warns.
`argv --gpu-memory` is plan's declaration, and `argv --parallel auto` plans for it or refuses
without GPU sizes."""
from __future__ import annotations

import json
from types import SimpleNamespace

import psutil
import pytest

from vllm_omni_launcher.cli import build_parser, main
from vllm_omni_launcher.errors import LauncherError
from vllm_omni_launcher.planner.explicit_fit import REFUSE_OVER
from vllm_omni_launcher.planner.gpus import GpuScan
from vllm_omni_launcher.planner.launch_plan import GPU_MEMORY_ENV, ServingChoice, resolve_launch
from vllm_omni_launcher.planner.memory import plan
from vllm_omni_launcher.server.config.local_config import LocalConfig
from vllm_omni_launcher.server.launch.versions import DEFAULT_VERSION

T2V = "Wan-AI/Wan2.2-T2V-A14B-Diffusers"
TI2V = "Wan-AI/Wan2.2-TI2V-5B-Diffusers"
CONFIG = LocalConfig()
ULYSSES_2 = ServingChoice(parallel_mode="ulysses", parallel_degree=2, vae_patch_parallel=2)
ONE_GPU = ServingChoice(parallel_mode="none")


def _resolve(choice: ServingChoice, model: str, **kw):
    """What the Local Server node resolves for `choice` (the server line fixed: no server environment here)."""
    return resolve_launch(choice.base_spec(model, CONFIG), CONFIG, gpus=choice.gpus, server_version=DEFAULT_VERSION,
                          **kw)


def _misfit(choice: ServingChoice, model: str) -> str:
    """The one warning the plan of explicit settings gives; the recommendation text stays empty (none was made)."""
    plan = _resolve(choice, model)
    assert plan.text == ""
    (warning,) = plan.warnings
    return warning


def _load_gib(choice: ServingChoice, model: str) -> float:
    """What the plan says one GPU holds from the start for `choice` (a card big enough for anything)."""
    g = plan(choice.base_spec(model, CONFIG), gpus=[4000.0], server_version=DEFAULT_VERSION).gpus[0]
    return g.phases["resident"] + g.outside_gib


def test_ulysses_on_two_24s_is_refused_before_launching(monkeypatch):
    monkeypatch.setenv(GPU_MEMORY_ENV, "24,24")
    with pytest.raises(LauncherError) as info:
        _resolve(ULYSSES_2, T2V)
    err = info.value
    assert err.what.startswith("These serving settings do not fit the GPUs: peak 72.2 GiB vs 24.0 GiB per GPU")
    assert "more than 10% over the card" in err.why and f"{GPU_MEMORY_ENV}=24,24" in err.why
    for widget in ("parallel_mode to auto", "offload to module or layerwise", "vae_tiling on"):
        assert widget in err.fix
    assert err.setting == "parallel_mode"


def test_the_same_settings_on_two_80s_launch_without_a_word(monkeypatch):
    monkeypatch.setenv(GPU_MEMORY_ENV, "80,80")
    plan = _resolve(ULYSSES_2, T2V)
    assert plan.text == "" and plan.warnings == []


def test_a_load_within_the_plans_error_is_a_warning_beyond_it_a_refusal(monkeypatch):
    load = _load_gib(ONE_GPU, TI2V)
    monkeypatch.setenv(GPU_MEMORY_ENV, f"{load / (1 + REFUSE_OVER / 2):.2f}")
    text = _misfit(ONE_GPU, TI2V)
    assert text.startswith("the memory plan says these settings do not fit: peak ")
    assert "expect an out-of-memory failure" in text and "parallel_mode to auto" in text
    monkeypatch.setenv(GPU_MEMORY_ENV, f"{load / (1 + 2 * REFUSE_OVER):.2f}")
    with pytest.raises(LauncherError, match="do not fit the GPUs"):
        _resolve(ONE_GPU, TI2V)


def test_a_request_that_overflows_only_in_its_activations_is_a_warning(monkeypatch):
    monkeypatch.setenv(GPU_MEMORY_ENV, "24")    # TI2V-5B loads in 24 GiB; 1280x704x121 does not run in it
    text = _misfit(ONE_GPU, TI2V)
    assert text.startswith("the memory plan says ") and "for Wan2.2 TI2V-5B at 1280x704x121" in text


def test_argv_warns_and_prints_the_command_it_was_asked_for(capsys):
    assert main(["argv", "--model", T2V, "--parallel", "ulysses=2", "--vae-patch", "2", "--gpu-memory",
                 "24,24"]) == 0
    out = capsys.readouterr()
    assert "--usp 2 --vae-patch-parallel-size 2" in out.out
    assert "warning: the memory plan says these settings do not fit: peak 72.2 GiB vs 24.0 GiB" in out.err


def test_argv_takes_plans_gpu_memory_declaration():
    def action(command: str):
        return next(a for a in build_parser(command)._actions if a.dest == "gpu_memory")
    argv, plan_ = action("argv"), action("plan")
    assert argv.type is plan_.type and argv.metavar == plan_.metavar == "GIB,GIB"
    assert argv.help.split(";")[0] == plan_.help.split(";")[0]


def test_argv_parallel_auto_plans_for_the_given_sizes(monkeypatch, capsys):
    monkeypatch.setattr("vllm_omni_launcher.planner.launch_plan.scan_gpus", lambda: GpuScan([], "no NVML here"))
    assert main(["argv", "--model", T2V, "--parallel", "auto", "--gpu-memory", "80,80", "--json"]) == 0
    out = capsys.readouterr()
    shown = json.loads(out.out)
    assert "--cfg-parallel-size" in shown["argv"] and shown["env"]["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert "Recommended: " in out.err


def test_argv_parallel_auto_without_gpu_sizes_refuses_naming_gpu_memory(monkeypatch, capsys):
    monkeypatch.setattr("vllm_omni_launcher.planner.launch_plan.scan_gpus", lambda: GpuScan([], "no NVML here"))
    monkeypatch.delenv(GPU_MEMORY_ENV, raising=False)
    assert main(["argv", "--model", T2V, "--parallel", "auto"]) == 1
    err = capsys.readouterr().err
    assert "argv --parallel auto has no GPU sizes to plan for" in err and "no NVML here" in err
    assert "--gpu-memory 24,24" in err


def test_offload_with_too_little_host_ram_for_what_it_moves_is_a_warning(monkeypatch):
    monkeypatch.setattr(psutil, "virtual_memory", lambda: SimpleNamespace(total=16 << 30, available=8 << 30))
    monkeypatch.setenv(GPU_MEMORY_ENV, "80")     # the GPU holds it: only the host RAM does not
    text = _misfit(ServingChoice(parallel_mode="none", offload="layerwise"), T2V)
    assert text.startswith("host RAM is too small for what offload 'layerwise' moves off the GPUs (needs ")
    assert "GiB)" in text and "expect the server to fail while loading" in text and "free host RAM" in text
