"""upstream_resolve.py: the real vLLM-Omni 0.30 parser + config resolution, in one batch.

Runs under the ComfyUI-side python; the resolver runs under the server python
(``VLLM_OMNI_LAUNCHER_TEST_SERVER_PYTHON``): the session's one resolver process.
"""
from __future__ import annotations

import pytest

T2V = "Wan-AI/Wan2.2-T2V-A14B-Diffusers"
I2V = "Wan-AI/Wan2.2-I2V-A14B-Diffusers"
TI2V = "Wan-AI/Wan2.2-TI2V-5B-Diffusers"

CASES = {
    "default": {"argv": ["serve", T2V, "--omni"], "visible_devices": 2},
    "usp2": {"argv": ["serve", T2V, "--omni", "--usp", "2"], "visible_devices": 2},
    "usp2_cfg2": {"argv": ["serve", T2V, "--omni", "--usp", "2", "--cfg-parallel-size", "2"],
                  "visible_devices": "0,1"},
    "fake_flag": {"argv": ["serve", T2V, "--omni", "--model-type", "wan2_2"], "visible_devices": 1},
    "tp_hsdp": {"argv": ["serve", I2V, "--omni", "-tp", "2", "--use-hsdp"], "visible_devices": 2},
    "memory": {"argv": ["serve", TI2V, "--omni", "--quantization", "fp8", "--enable-cpu-offload",
                        "--vae-use-tiling"], "visible_devices": 1},
    "unknown_repo": {"argv": ["serve", "Wan-AI/Wan2.2-Nope-Diffusers", "--omni"], "visible_devices": 1},
    "cfg_prefix": {"argv": ["serve", I2V, "--omni", "--cfg", "2"], "visible_devices": 2},
    "deploy_yaml": {"argv": ["serve", T2V, "--omni", "--deploy-config", "wan2_2_ti2v.yaml"], "visible_devices": 1},
    "moe_knobs": {"argv": ["serve", T2V, "--omni", "--boundary-ratio", "0.9", "--flow-shift", "12",
                           "--enforce-eager", "--cache-backend", "cache_dit"], "visible_devices": 1},
    "pinned_gpus": {"argv": ["serve", TI2V, "--omni", "--usp", "2"], "visible_devices": "2,3"},
    "num_gpus": {"argv": ["serve", T2V, "--omni", "--num-gpus", "2"], "visible_devices": 2},
    "i2v_unset_cvd": {"argv": ["serve", I2V, "--omni", "--usp", "2"], "visible_devices": 1},
    "no_model": {"argv": ["serve", "--omni"], "visible_devices": 1},
}


@pytest.fixture(scope="module")
def results(upstream_resolver) -> dict[str, dict]:
    names = list(CASES)
    out = upstream_resolver.resolve([CASES[n] for n in names])
    assert len(out) == len(names)
    return dict(zip(names, out))


def test_default_resolves_to_one_gpu(results):
    r = results["default"]
    assert r["ok"], r
    cfg = r["config"]
    assert cfg["model"] == T2V and cfg["model_class_name"] == "WanPipeline"
    assert (cfg["world_size"], cfg["devices"], cfg["enforce_eager"], cfg["vae_use_tiling"]) == (1, ["0"], False, False)
    assert cfg["quantization"] is None and cfg["boundary_ratio"] is None and cfg["flow_shift"] is None


def test_usp2_uses_both_visible_devices(results):
    cfg = results["usp2"]["config"]
    assert (cfg["world_size"], cfg["ulysses_degree"], cfg["cfg_parallel_size"], cfg["devices"]) == (2, 2, 1, ["0", "1"])


def test_world_larger_than_visible_devices_is_refused_at_config_time(results):
    r = results["usp2_cfg2"]
    assert not r["ok"] and r["stage"] == "resolve"
    assert r["error"].startswith("Stage 0 requires 4 device(s) based on parallel_config, but 2 device(s) are "
                                 "available")
    assert r["top_error"].startswith("RuntimeError: Orchestrator initialization failed: Stage 0 requires 4")


def test_fake_flag_fails_in_argparse(results):
    r = results["fake_flag"]
    assert (r["ok"], r["stage"], r["exit_code"]) == (False, "parse", 2)
    assert r["error"] == "unrecognized arguments: --model-type wan2_2"


def test_hsdp_with_tp_is_refused(results):
    r = results["tp_hsdp"]
    assert not r["ok"] and r["stage"] == "resolve"
    assert "HSDP (FSDP2) is not compatible with TP" in r["error"]


def test_memory_flags_resolve(results):
    cfg = results["memory"]["config"]
    assert cfg["model_class_name"] == "WanPipeline"
    assert (cfg["quantization"], cfg["enable_cpu_offload"], cfg["vae_use_tiling"]) == ("fp8", True, True)


def test_unknown_repo_fails_like_a_missing_model(results):
    r = results["unknown_repo"]
    assert not r["ok"] and r["stage"] == "resolve"
    assert r["error"] == ("Repository not found for 'Wan-AI/Wan2.2-Nope-Diffusers'. "
                          "Please check the model name or path.")


def test_cfg_is_an_argparse_abbreviation(results):
    cfg = results["cfg_prefix"]["config"]
    assert cfg["model_class_name"] == "WanImageToVideoPipeline"
    assert (cfg["world_size"], cfg["cfg_parallel_size"]) == (2, 2)


def test_bundled_deploy_yaml_applies_to_t2v(results):
    cfg = results["deploy_yaml"]["config"]
    assert (cfg["enforce_eager"], cfg["vae_use_tiling"], cfg["max_num_seqs"]) == (True, True, 4)
    assert cfg["distributed_executor_backend"] == "mp"


def test_server_moe_and_runtime_flags(results):
    cfg = results["moe_knobs"]["config"]
    assert (cfg["boundary_ratio"], cfg["flow_shift"], cfg["enforce_eager"], cfg["cache_backend"]) == \
        (0.9, 12.0, True, "cache_dit")


def test_cuda_visible_devices_are_the_stage_devices(results):
    cfg = results["pinned_gpus"]["config"]
    assert (cfg["world_size"], cfg["devices"], cfg["missing_devices"]) == (2, ["2", "3"], [])


def test_num_gpus_does_nothing(results):
    assert results["num_gpus"]["config"]["world_size"] == 1


def test_i2v_generic_path_resolves_devices_the_machine_lacks(results):
    cfg = results["i2v_unset_cvd"]["config"]
    assert (cfg["world_size"], cfg["devices"], cfg["missing_devices"]) == (2, ["0", "1"], ["1"])


def test_missing_model_is_refused_by_validate(results):
    r = results["no_model"]
    assert not r["ok"] and r["stage"] == "parse"
    assert r["error"].startswith("`vllm serve --omni` requires an explicit model.")
