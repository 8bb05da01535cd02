"""On the command line an error's fix names the options to change, not the node widgets the core's
text names ("set frames to 81" -> "set --frames to 81"), in text and JSON, and the map from settings
to options comes from the command's own argparse declarations."""
from __future__ import annotations

import json

import pytest

from vllm_omni_launcher.cli import build_parser, main
from vllm_omni_launcher.cli.report import option_flags

T2V = "Wan-AI/Wan2.2-T2V-A14B-Diffusers"


@pytest.mark.parametrize("argv,fix", [
    (["plan", "--model", T2V, "--frames", "80", "--gpu-memory", "80"], "Fix: set --frames to 81."),
    (["plan", "--model", T2V, "--height", "700", "--gpu-memory", "80"], "Fix: set --height to 688 or 704."),
    (["argv", "--model", T2V, "--parallel", "ulysses=3", "--gpus", "0,1,2", "--gpu-memory", "3x80"],
     "Fix: --parallel: use a degree in [2, 4, 5, 8], or set --ulysses-mode to 'advanced_uaa' (uneven split)."),
    (["argv", "--model", T2V, "--parallel", "ulysses=2", "--gpus", "0,5", "--gpu-memory", "24,24"],
     "Fix: --gpus: use ids 0..1."),
    (["argv", "--model", T2V, "--parallel", "ulysses=2", "--gpus", "0,1,2,3", "--replicas", "3",
      "--gpu-memory", "8x80"],
     "Fix: --gpus: select 6 GPUs, or lower --parallel or --replicas."),
    (["argv", "--model", T2V, "--parallel", "ulysses=2", "--offload", "layerwise", "--gpu-memory", "80,80"],
     "Fix: set --offload to 'module' (works with every parallel mode), or set --parallel to 'none'."),
])
def test_the_fix_names_the_options(capsys, argv, fix):
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.rstrip().endswith(fix), err


def test_json_errors_name_the_options_and_keep_the_setting(capsys):
    assert main(["argv", "--model", T2V, "--parallel", "ulysses=2", "--gpus", "0,5", "--gpu-memory", "24,24",
                 "--json"]) == 1
    error = json.loads(capsys.readouterr().out)["error"]
    assert error["fix"] == "--gpus: use ids 0..1" and error["setting"] == "gpus"


def test_plan_reports_the_given_specs_error_with_options_too(capsys):
    main(["plan", "--model", T2V, "--parallel", "ulysses=3", "--gpu-memory", "80,80,80"])
    assert "set --ulysses-mode to 'advanced_uaa'" in capsys.readouterr().out


def test_the_setting_to_option_map_comes_from_the_parser():
    parser = build_parser("argv")
    flags = option_flags(parser)
    declared = {o for a in parser._actions for o in a.option_strings}
    assert set(flags.values()) <= declared
    # the nodes' names for the composite options map to the option that sets them
    assert flags["parallel_mode"] == flags["parallel_degree"] == "--parallel"
    assert flags["vae_patch_parallel"] == "--vae-patch" and flags["gpu_memory"] == "--gpu-memory"
    assert "gpu_memory" not in option_flags(build_parser("serve"))


def test_the_explicit_settings_refusal_names_serves_options(monkeypatch):
    from vllm_omni_launcher.cli.report import for_command_line
    from vllm_omni_launcher.errors import LauncherError
    from vllm_omni_launcher.planner.launch_plan import GPU_MEMORY_ENV, ServingChoice, resolve_launch
    from vllm_omni_launcher.server.config.local_config import LocalConfig
    from vllm_omni_launcher.server.launch.versions import DEFAULT_VERSION

    monkeypatch.setenv(GPU_MEMORY_ENV, "24,24")
    base = ServingChoice(parallel_mode="ulysses", parallel_degree=2).base_spec(T2V, LocalConfig())
    with pytest.raises(LauncherError) as info:
        resolve_launch(base, LocalConfig(), server_version=DEFAULT_VERSION)
    fix = for_command_line(info.value, option_flags(build_parser("serve"))).fix
    for said in ("set --parallel to auto", "set --offload to module or layerwise", "turn --vae-tiling on"):
        assert said in fix, fix
