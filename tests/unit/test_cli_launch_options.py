"""The launch options are generated from the LaunchSpec declaration: every setting has exactly one
option, with the spec's choices, default and help, and the parsed options rebuild the spec."""
from __future__ import annotations

import argparse
import dataclasses
from typing import Literal, Optional, get_type_hints

import pytest

from vllm_omni_launcher.cli.launch_options import SETTINGS, add_launch_options, spec_from_args
from vllm_omni_launcher.server.config.settings import setting, settings_of
from vllm_omni_launcher.server.launch.spec import (CACHE_BACKENDS, OFFLOAD_MODES, PARALLEL_MODES, LaunchSpec,
                                            MemoryConfig, ParallelConfig, RuntimeConfig)

T2V = "Wan-AI/Wan2.2-T2V-A14B-Diffusers"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    add_launch_options(parser)
    return parser


def _options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {a.dest: a for a in parser._actions if a.option_strings and a.dest != "help"}


def test_every_spec_setting_is_declared_with_help():
    names = {s.name for s in SETTINGS}
    hints = get_type_hints(LaunchSpec)
    groups = [f.name for f in dataclasses.fields(LaunchSpec) if dataclasses.is_dataclass(hints[f.name])]
    nested = {f.name for g in groups for f in dataclasses.fields(hints[g])}
    top = {f.name for f in dataclasses.fields(LaunchSpec)} - set(groups)
    assert {"parallel", "memory", "runtime"} <= set(groups) and names == nested | top
    assert all(s.help for s in SETTINGS)


def test_choices_defaults_and_help_come_from_the_spec():
    options = _options(_parser())
    by_name = {s.name: s for s in SETTINGS}
    for name in ("ulysses_mode", "offload", "quantization", "cache_backend"):
        action, s = options[name], by_name[name]
        assert tuple(action.choices) == s.choices and action.default == s.default
        assert action.help.startswith(s.help)
    assert tuple(options["offload"].choices) == OFFLOAD_MODES == ("none", "module", "layerwise")
    assert tuple(by_name["cache_backend"].choices) == CACHE_BACKENDS
    assert all(mode in options["parallel"].help for mode in PARALLEL_MODES if mode != "none")
    for name in ("vae_tiling", "vae_slicing", "enforce_eager", "hsdp"):
        assert options[name].default is False and options[name].nargs == 0     # switches
    assert options["vae_patch"].type is int and options["boundary_ratio"].type is float


def test_defaults_parse_to_the_default_spec():
    args = _parser().parse_args(["--model", T2V])
    assert spec_from_args(args) == LaunchSpec(model=T2V)
    assert spec_from_args(args, default_host="0.0.0.0").host == "0.0.0.0"


def test_every_option_reaches_its_field():
    args = _parser().parse_args([
        "--model", T2V, "--gpus", "0,1", "--parallel", "usp=2", "--vae-patch", "2", "--ulysses-mode",
        "advanced_uaa", "--hsdp", "--offload", "module", "--quantization", "fp8", "--vae-tiling", "--vae-slicing",
        "--cache-backend", "cache_dit", "--enforce-eager", "--boundary-ratio", "0.9", "--flow-shift", "5",
        "--served-model-name", "wan", "--host", "127.0.0.2", "--port", "9000", "--extra-flag=--max-num-seqs=2"])
    assert spec_from_args(args) == LaunchSpec(
        model=T2V, gpus=(0, 1),
        parallel=ParallelConfig(mode="ulysses", degree=2, vae_patch=2, ulysses_mode="advanced_uaa", hsdp=True),
        memory=MemoryConfig(offload="module", quantization="fp8", vae_tiling=True, vae_slicing=True),
        runtime=RuntimeConfig(cache_backend="cache_dit", enforce_eager=True, boundary_ratio=0.9, flow_shift=5.0),
        served_model_name="wan", host="127.0.0.2", port=9000, extra_flags=("--max-num-seqs=2",))


def test_a_setting_without_help_is_refused_at_declaration():
    with pytest.raises(TypeError):
        setting(1)

    @dataclasses.dataclass(frozen=True)
    class Half:
        ok: Literal["a", "b"] = setting("a", "an option set")
        forgotten: Optional[int] = None

    with pytest.raises(TypeError, match="Half.forgotten"):
        settings_of(Half)
