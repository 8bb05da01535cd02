"""Serving Config's `speed` choice: `exact` (the default) plans only with levers that keep the output, `fast`
lets `auto` also use the levers measured faster on the server's line (FP8 on vLLM-Omni 0.30,
bench/results/h200-levers-vllm-omni-0.30/), and the plan text says so; the measured lever factors are what
rank the rungs."""
from __future__ import annotations

from dataclasses import replace

import pytest

from vllm_omni_launcher.planner import launch_plan
from vllm_omni_launcher.planner.ladder import recommend
from vllm_omni_launcher.planner.launch_plan import ServingChoice, resolve_launch
from vllm_omni_launcher.planner.request_shape import RequestShape
from vllm_omni_launcher.planner.speed_costs import JOB_TIMES_0_30, fast_levers, speed_cost
from vllm_omni_launcher.server.config.local_config import LocalConfig
from vllm_omni_launcher.server.config.settings import settings_of
from vllm_omni_launcher.server.launch.spec import LaunchSpec, MemoryConfig, RuntimeConfig

TI2V = "Wan-AI/Wan2.2-TI2V-5B-Diffusers"
CLIP = RequestShape(1280, 704, 121)


def test_speed_is_the_last_serving_setting_appended_with_exact_as_default():
    """Saved workflows store Serving Config's widgets by position: a new one goes last, optional, and its
    default keeps what older workflows planned."""
    last = settings_of(ServingChoice)[-1]
    assert (last.name, last.default, last.choices) == ("speed", "exact", ("exact", "fast"))
    assert last.extra.get("appended") is True
    assert ServingChoice().speed == "exact"


def test_measured_fp8_and_compile_factors_rank_the_0_30_rungs():
    bf16 = LaunchSpec(TI2V, runtime=RuntimeConfig(enforce_eager=True))
    fp8 = replace(bf16, memory=MemoryConfig(quantization="fp8"))
    compiled = replace(bf16, runtime=RuntimeConfig(enforce_eager=False))
    den_bf16, _ = JOB_TIMES_0_30.parts(bf16, CLIP, 20, True)
    den_fp8, _ = JOB_TIMES_0_30.parts(fp8, CLIP, 20, True)
    den_compiled, _ = JOB_TIMES_0_30.parts(compiled, CLIP, 20, True)
    assert den_fp8 / den_bf16 == pytest.approx(1.619 / 1.763, abs=0.005)        # the measured s/step
    assert den_compiled / den_bf16 == pytest.approx(1.664 / 1.763, abs=0.005)
    assert speed_cost(fp8, request=CLIP, steps=20, server_version=(0, 30)) < 1.0
    assert speed_cost(fp8, server_version=(0, 26)) == speed_cost(bf16, server_version=(0, 26))   # unmeasured


def test_exact_never_quantizes_and_fast_picks_fp8_where_it_is_faster():
    exact = recommend(TI2V, CLIP, [141.0], host_available_gib=64.0, server_version=(0, 30))
    fast = recommend(TI2V, CLIP, [141.0], host_available_gib=64.0, server_version=(0, 30), speed="fast")
    assert exact.spec.memory.quantization == "none"
    assert fast.spec.memory.quantization == "fp8"
    assert replace(fast.spec, memory=replace(fast.spec.memory, quantization="none")) == exact.spec
    assert "speed fast: FP8 DiT weights" in fast.text() and "cache-dit is not chosen" in fast.text()
    assert "speed fast" not in exact.text()


@pytest.mark.parametrize("card", [24.0, 16.0])
def test_fast_on_a_small_card_fits_and_is_no_slower_than_exact(card):
    exact = recommend(TI2V, CLIP, [card], host_available_gib=64.0, server_version=(0, 30))
    fast = recommend(TI2V, CLIP, [card], host_available_gib=64.0, server_version=(0, 30), speed="fast")
    assert fast.plan.fits and not fast.reduced
    cost_exact, cost_fast = (speed_cost(r.spec, request=CLIP, server_version=(0, 30)) for r in (exact, fast))
    assert cost_fast <= cost_exact


def test_fast_on_a_line_without_measured_levers_plans_as_exact_and_says_so():
    assert fast_levers((0, 26)) == ()
    exact = recommend(TI2V, CLIP, [141.0], host_available_gib=64.0, server_version=(0, 26))
    fast = recommend(TI2V, CLIP, [141.0], host_available_gib=64.0, server_version=(0, 26), speed="fast")
    assert fast.spec == exact.spec and fast.spec.memory.quantization == "none"
    assert "no lever was measured faster on this vLLM-Omni line" in fast.text()


def test_auto_launch_resolves_fast_to_fp8_and_says_it_in_the_plan_text(monkeypatch, tmp_path):
    monkeypatch.setenv(launch_plan.GPU_MEMORY_ENV, "141")
    config = LocalConfig(data_dir=str(tmp_path))
    base = LaunchSpec(TI2V, runtime=RuntimeConfig(enforce_eager=True))
    fast = resolve_launch(base, config, auto=True, server_version=(0, 30), starts=False, speed="fast")
    exact = resolve_launch(base, config, auto=True, server_version=(0, 30), starts=False)
    assert fast.spec.memory.quantization == "fp8" and "speed fast" in fast.text
    assert exact.spec.memory.quantization == "none" and "speed fast" not in exact.text


def test_serving_config_hands_its_speed_to_the_launch_resolution(monkeypatch, tmp_path):
    seen = {}

    def resolve(base, config, **kw):
        seen.update(kw)
        return "plan"

    monkeypatch.setattr(launch_plan, "resolve_launch", resolve)
    config = LocalConfig(data_dir=str(tmp_path))
    assert ServingChoice(speed="fast").resolve(TI2V, config) == "plan"
    assert seen["speed"] == "fast" and seen["auto"] is True


@pytest.mark.parametrize("command", ["plan", "argv", "serve", "generate"])
def test_every_launch_command_documents_speed_in_its_help(command, capsys):
    """The help texts quote measured percentages; argparse must print them, not fail on the '%'."""
    from vllm_omni_launcher.cli import main

    assert main([command, "--help"]) == 0
    assert "--speed {exact,fast}" in capsys.readouterr().out


def test_plan_speed_fast_recommends_fp8_for_a_24_gib_card_and_says_why(capsys):
    from vllm_omni_launcher.cli import main

    # --host-ram: layerwise offload needs ~22 GiB of host RAM, and a busy test machine may have less free
    args = ["plan", "--model", TI2V, "--parallel", "auto", "--width", "1280", "--height", "704", "--frames", "121",
            "--gpu-memory", "24", "--host-ram", "64"]
    main(args)
    exact = capsys.readouterr().out
    main([*args, "--speed", "fast"])
    fast = capsys.readouterr().out
    assert "--enable-layerwise-offload" in exact and "--quantization fp8" not in exact.split("== recommendation ==")[1]
    recommended = fast.split("== recommendation ==")[1]
    assert "--enable-layerwise-offload --quantization fp8" in recommended
    assert "speed fast: FP8 DiT weights" in recommended
