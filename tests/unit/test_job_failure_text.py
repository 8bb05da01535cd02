"""A failed job's explanation (client/http_errors.job_failed_error, what Generate Video and `generate`
show) matches upstream's own wording and names our settings: every Serving Config widget and CLI
option the OOM fix names is one that is declared, with values it accepts (client/ cannot import
those declarations, so they are checked here)."""
from __future__ import annotations

import dataclasses
import re
import typing

import pytest

from vllm_omni_launcher.cli import build_parser
from vllm_omni_launcher.cli.launch_options import spec_from_args
from vllm_omni_launcher.client.http_errors import OOM_FIX, job_failed_error
from vllm_omni_launcher.planner.launch_plan import ServingChoice
from vllm_omni_launcher.server.launch.sections import OFFLOAD_MODES


def test_the_oom_fix_names_serving_configs_widgets_and_their_values() -> None:
    widgets = {f.name: f for f in dataclasses.fields(ServingChoice)}
    named = re.findall(r"\b(vae_tiling|offload|parallel_mode|parallel_degree)\b", OOM_FIX)
    assert set(named) == {"vae_tiling", "offload", "parallel_mode", "parallel_degree"} <= set(widgets)
    modes = typing.get_args(typing.get_type_hints(ServingChoice)["parallel_mode"])
    flat = {m for mode in modes for m in (typing.get_args(mode) or (mode,))}
    assert {"ulysses", "cfg", "auto"} <= flat and "module" in OFFLOAD_MODES
    assert "--usp" not in OOM_FIX and "--cfg-parallel-size" not in OOM_FIX       # upstream's flags, not ours


def test_the_oom_fix_names_cli_options_the_real_parser_accepts() -> None:
    cli = re.search(r"\(CLI: ([^)]*)\)", OOM_FIX)
    assert cli is not None
    options = [o for part in cli.group(1).split(", ") for o in part.split(" or ")]
    assert options == ["--vae-tiling", "--offload module", "--parallel ulysses=2", "--parallel cfg=2"]
    parser = build_parser("serve")
    specs = [spec_from_args(parser.parse_args(["--model", "Wan-AI/Wan2.2-TI2V-5B-Diffusers", *o.split()]))
             for o in options]
    assert specs[0].memory.vae_tiling and specs[1].memory.offload == "module"
    assert [(s.parallel.mode, s.parallel.degree) for s in specs[2:]] == [("ulysses", 2), ("cfg", 2)]
    assert "--parallel auto" in OOM_FIX


@pytest.mark.parametrize("message", [
    "`height` and `width` have to be divisible by 16 but are 500 and 832.",           # I2V-A14B
    "`height` and `width` must be divisible by 32, got 500 and 832.",                  # S2V
])
def test_sizes_upstream_refuses_name_width_and_height(message: str) -> None:
    err = job_failed_error("j", message, "raw")
    assert "width/height not accepted" in err.what and err.setting == "width"


def test_a_dead_engine_is_said_as_such() -> None:
    # vllm's EngineDeadError text, as a failed job carries it
    err = job_failed_error("j", "EngineCore encountered an issue. See stack trace (above) for the root cause.", "r")
    assert "engine died" in err.what and err.setting == "server"


def test_other_divisibility_errors_are_not_taken_for_a_size() -> None:
    err = job_failed_error("j", "ValueError: dim (5120) must be divisible by num_heads (40)", "raw")
    assert err.what.startswith("The server failed job j: ValueError: dim (5120)")
