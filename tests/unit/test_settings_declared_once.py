"""Each setting is declared once (issue 12): the Serving Config widgets, the CLI options and the local
config come from `setting()` declarations, and the node and the CLI resolve a launch with the same
`resolve_launch()`."""
from __future__ import annotations

import argparse
import dataclasses
import json

import pytest

from comfy_standin import run_node
from vllm_omni_launcher.nodes import NODES
from vllm_omni_launcher.cli import main
from vllm_omni_launcher.cli.launch_options import add_launch_options, launch_from_args
from vllm_omni_launcher.errors import LauncherError
from vllm_omni_launcher.planner.gpus import GpuScan
from vllm_omni_launcher.planner.launch_plan import (GPU_MEMORY_ENV, RequestLimit, ServingChoice, resolve_launch,
                                                    select_gpus)
from vllm_omni_launcher.server.config import local_config
from vllm_omni_launcher.server.config.local_config import LocalConfig
from vllm_omni_launcher.server.config.settings import like, setting, settings_of
from vllm_omni_launcher.server.launch.spec import (CACHE_BACKENDS, OFFLOAD_MODES, PARALLEL_MODES, LaunchSpec, MemoryConfig,
                                            ParallelConfig, RuntimeConfig)
from vllm_omni_launcher.server.launch.versions import DEFAULT_VERSION

T2V = "Wan-AI/Wan2.2-T2V-A14B-Diffusers"
TI2V = "Wan-AI/Wan2.2-TI2V-5B-Diffusers"
# Saved workflows store Serving Config's values by position: these names, in this order, are the format.
RELEASED_WIDGETS = ["gpus", "parallel_mode", "parallel_degree", "vae_patch_parallel", "offload", "fp8",
                    "vae_tiling", "cache_backend", "compile", "keep_alive_minutes", "auto_fallback", "replicas",
                    "speed"]
CONFIG = LocalConfig()


def _spec_help(cls: type, name: str) -> str:
    return next(f for f in dataclasses.fields(cls) if f.name == name).metadata["help"]


# --------------------------------------------------------------------------- node inputs
def test_serving_config_widgets_are_the_serving_choice_declarations_in_released_order():
    declared = NODES["VLLMOmniServingConfig"].inputs()
    assert [i.name for i in declared if i.optional] == ["replicas", "speed"]   # appended after a release: optional, last
    inputs = {i.name: i for i in declared}
    assert list(inputs) == RELEASED_WIDGETS == [f.name for f in dataclasses.fields(ServingChoice)]
    for s in settings_of(ServingChoice):
        spec = inputs[s.name]
        assert spec.tooltip == s.help and spec.default == s.default
        assert spec.kind == ("COMBO" if s.choices else {bool: "BOOLEAN", int: "INT", str: "STRING"}[s.type])
        assert spec.choices() == list(s.choices)
    assert inputs["parallel_mode"].choices() == ["auto", *PARALLEL_MODES]
    assert inputs["offload"].choices() == list(OFFLOAD_MODES) and inputs["cache_backend"].choices() == list(CACHE_BACKENDS)
    assert (inputs["parallel_degree"].opts["min"], inputs["parallel_degree"].opts["max"]) == (1, 8)
    assert (inputs["keep_alive_minutes"].opts["min"], inputs["keep_alive_minutes"].opts["max"]) == (0, 1440)
    assert (inputs["compile"].default, inputs["auto_fallback"].default) == (True, True)


def test_widgets_the_launch_spec_also_has_share_its_declaration():
    inputs = {i.name: i.tooltip for i in NODES["VLLMOmniServingConfig"].inputs()}
    assert inputs["offload"] == _spec_help(MemoryConfig, "offload")
    assert inputs["vae_tiling"] == _spec_help(MemoryConfig, "vae_tiling")
    assert inputs["cache_backend"] == _spec_help(RuntimeConfig, "cache_backend")
    assert inputs["vae_patch_parallel"].startswith(_spec_help(ParallelConfig, "vae_patch"))
    assert inputs["parallel_degree"].startswith(_spec_help(ParallelConfig, "degree"))


def test_configure_returns_the_choice_its_widgets_declare():
    defaults = {i.name: i.default for i in NODES["VLLMOmniServingConfig"].inputs()}
    assert run_node("VLLMOmniServingConfig", **defaults) == (ServingChoice(),)
    assert run_node("VLLMOmniServingConfig", **{**defaults, "gpus": "  "})[0].gpus == "auto"
    assert run_node("VLLMOmniServingConfig", **{k: v for k, v in defaults.items() if k != "replicas"}) == (
        ServingChoice(),)                       # an appended widget a released workflow lacks: its default


def test_like_copies_a_declaration_with_changes_and_a_note():
    @dataclasses.dataclass(frozen=True)
    class Widgets:
        degree: int = like(ParallelConfig, "degree", default=2, min=1, note="ignored for none")

    (s,) = settings_of(Widgets)
    assert s.default == 2 and s.extra == {"min": 1} and s.help == _spec_help(ParallelConfig, "degree") + \
        "; ignored for none"


def test_the_local_config_is_declared_with_the_same_setting():
    records = {s.name: s for s in settings_of(LocalConfig)}
    assert list(records) == [f.name for f in dataclasses.fields(LocalConfig)]
    assert records["server_command"].extra["env"] == "SERVER_CMD" and records["port"].extra["check"](0)
    assert records["extra_env"].default == {} and LocalConfig().extra_env is not LocalConfig().extra_env
    assert not hasattr(local_config, "_setting")           # no second declare-once mechanism
    with pytest.raises(TypeError):
        setting(1)


# --------------------------------------------------------------------------- one resolve_launch
def test_gpu_selection_auto_all_ids_and_count():
    assert select_gpus("auto", [0, 1]) is None and select_gpus("all", [0, 1]) is None
    assert select_gpus("1,0", [0, 1]) == (1, 0) and select_gpus("count=1", [3, 5]) == (3,)
    with pytest.raises(LauncherError) as err:
        select_gpus("count=3", [0, 1])
    assert err.value.setting == "gpus" and "count=2" in err.value.fix


def _cli_plan(*argv: str, command_args: tuple[str, ...] = ()):
    parser = argparse.ArgumentParser()
    add_launch_options(parser, launching=True)
    return launch_from_args(parser.parse_args([*argv, *command_args]), CONFIG, server_version=DEFAULT_VERSION)


def test_node_and_cli_resolve_an_explicit_choice_to_the_same_spec(monkeypatch):
    monkeypatch.setenv(GPU_MEMORY_ENV, "80,80")
    node = ServingChoice(gpus="count=2", parallel_mode="ulysses", parallel_degree=2, vae_patch_parallel=2,
                         offload="module", vae_tiling=True, compile=False)
    cli = _cli_plan("--model", T2V, "--gpus", "count=2", "--parallel", "ulysses=2", "--vae-patch", "2",
                    "--offload", "module", "--vae-tiling", "--enforce-eager")
    from_node = resolve_launch(node.base_spec(T2V, CONFIG), CONFIG, gpus=node.gpus, auto=False,
                               auto_fallback=True, server_version=DEFAULT_VERSION)
    assert cli.spec == from_node.spec and cli.spec.gpus == (0, 1)
    assert cli.fallback is not None and from_node.fallback is not None      # the OOM ladder, both ways


def test_node_and_cli_auto_ask_the_planner_the_same_question(monkeypatch):
    monkeypatch.setenv(GPU_MEMORY_ENV, "80,80")
    cli = _cli_plan("--model", T2V, "--parallel", "auto")
    node = resolve_launch(ServingChoice().base_spec(T2V, CONFIG), CONFIG, gpus="auto", auto=True,
                          server_version=DEFAULT_VERSION)
    assert cli.spec == node.spec and cli.text == node.text and cli.text.startswith("Recommended: ")
    assert cli.spec.parallel.world_size == 2


def test_auto_without_gpu_sizes_says_so_and_starts_on_one_gpu(monkeypatch):
    monkeypatch.setattr("vllm_omni_launcher.planner.launch_plan.scan_gpus", lambda: GpuScan([], "no NVML here"))
    plan = _cli_plan("--model", TI2V, "--parallel", "auto")
    assert plan.spec == LaunchSpec(model=TI2V) and plan.fallback is None
    assert plan.text.startswith("auto: no GPU information (no NVML here)")


def test_argv_parallel_auto_prints_the_planned_command(monkeypatch, capsys):
    monkeypatch.setenv(GPU_MEMORY_ENV, "80,80")
    assert main(["argv", "--model", T2V, "--parallel", "auto", "--json"]) == 0
    out = capsys.readouterr()
    argv = json.loads(out.out)["argv"]
    assert "--cfg-parallel-size" in argv and "Recommended: " in out.err
    assert json.loads(out.out)["env"]["CUDA_VISIBLE_DEVICES"] == "0,1"


def test_launching_commands_take_the_serving_choices_options_from_their_declaration():
    from vllm_omni_launcher.cli import build_parser

    declared = {s.name: s for s in settings_of(ServingChoice)}
    for command in ("serve", "generate"):
        actions = {a.dest: a for a in build_parser(command)._actions}
        assert actions["auto_fallback"].help.startswith(declared["auto_fallback"].help)
        assert actions["auto_fallback"].default is True
    serve = {a.dest: a for a in build_parser("serve")._actions}
    assert serve["keep_alive_minutes"].help.startswith(declared["keep_alive_minutes"].help)
    assert serve["keep_alive_minutes"].type is float and serve["keep_alive_minutes"].default is None
    generate = {a.dest: a for a in build_parser("generate")._actions}
    assert generate["parallel"].default == "auto" and "vllm-omni-YYYYmmdd-HHMMSS-SEED.mp4" in generate["out"].help


# --------------------------------------------------------------------------- the request limit
def test_a_plan_limit_fills_only_what_is_left_to_the_model():
    limit = RequestLimit(1280, 704, 113, "the serving plan fits 1280x704x113, not the model's 1280x704x121")
    cli, note = limit.apply({"width": None, "height": None, "frames": None})        # CLI: None
    assert cli == {"width": 1280, "height": 704, "frames": 113} and note.startswith("width, height, frames")
    assert limit.apply({"width": 640, "height": None, "frames": 81}) == (
        {"width": 640, "height": None, "frames": 81}, "")
