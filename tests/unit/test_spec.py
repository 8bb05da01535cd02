"""Launch spec: argv/env building and validation messages (no server environment needed)."""
from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace

import pytest

from vllm_omni_launcher.errors import SpecError
from vllm_omni_launcher.models import FAMILIES
from vllm_omni_launcher.server.launch.flags import NONEXISTENT_FLAGS
from vllm_omni_launcher.server.launch.spec import (LaunchSpec, MemoryConfig, ParallelConfig, RuntimeConfig,
                                            parse_gpus, parse_parallel)
from vllm_omni_launcher.server.launch.spec_rules import check_parallel, tensor_parallel_degrees

T2V = "Wan-AI/Wan2.2-T2V-A14B-Diffusers"
I2V = "Wan-AI/Wan2.2-I2V-A14B-Diffusers"
TI2V = "Wan-AI/Wan2.2-TI2V-5B-Diffusers"


def test_build_puts_api_key_in_env_never_in_argv():
    spec = LaunchSpec(T2V, gpus=(0, 1), parallel=ParallelConfig("ulysses", 2))
    cmd = spec.build(["vllm"], 8091, api_key="s3cret-key")
    assert cmd.argv == ["vllm", "serve", T2V, "--omni", "--usp", "2", "--host", "127.0.0.1", "--port", "8091"]
    assert cmd.env == {"CUDA_VISIBLE_DEVICES": "0,1", "VLLM_API_KEY": "s3cret-key"}
    assert "s3cret-key" not in " ".join(cmd.argv)
    assert "s3cret-key" not in repr(cmd)
    assert cmd.redacted()["env"]["VLLM_API_KEY"] == "***"


def test_all_visible_gpus_sets_no_cuda_visible_devices():
    cmd = LaunchSpec(TI2V).build(["vllm"], 9000, api_key=None)
    assert cmd.env == {}
    assert "--trust-remote-code" not in cmd.argv


def test_trust_remote_code_only_from_caller():
    cmd = LaunchSpec(TI2V).build(["/env/bin/vllm"], 9000, api_key=None, trust_remote_code=True)
    assert cmd.argv[0] == "/env/bin/vllm" and cmd.argv[-1] == "--trust-remote-code"


@pytest.mark.parametrize("parallel, flags", [
    (ParallelConfig("tensor", 2), ["--tensor-parallel-size", "2"]),
    (ParallelConfig("ring", 2), ["--ring", "2"]),
    (ParallelConfig("cfg", 2, vae_patch=2), ["--cfg-parallel-size", "2", "--vae-patch-parallel-size", "2"]),
    (ParallelConfig("hsdp", 2), ["--use-hsdp", "--hsdp-shard-size", "2"]),
    (ParallelConfig("ulysses", 2, hsdp=True), ["--usp", "2", "--use-hsdp"]),
    (ParallelConfig("ulysses", 2, ulysses_mode="advanced_uaa"), ["--usp", "2", "--ulysses-mode", "advanced_uaa"]),
])
def test_parallel_flags(parallel, flags):
    assert parallel.flags() == flags


def test_memory_and_runtime_flags():
    spec = LaunchSpec(T2V, memory=MemoryConfig("module", "fp8", True, True),
                      runtime=RuntimeConfig("cache_dit", True, 0.9, 5.0), served_model_name="wan")
    assert spec.flags() == ["--omni", "--served-model-name", "wan", "--enable-cpu-offload", "--quantization", "fp8",
                            "--vae-use-tiling", "--vae-use-slicing", "--cache-backend", "cache_dit",
                            "--enforce-eager", "--boundary-ratio", "0.9", "--flow-shift", "5"]
    assert spec.served_name == "wan"


def _error(spec: LaunchSpec, visible=None) -> SpecError:
    with pytest.raises(SpecError) as info:
        spec.validate(visible)
    return info.value


def test_world_size_larger_than_selected_gpus():
    err = _error(LaunchSpec(T2V, gpus=(0,), parallel=ParallelConfig("ulysses", 2)))
    assert err.setting == "gpus" and "needs 2 GPUs but 1 are selected" in str(err)
    assert "Stage 0 requires 2 device(s)" in str(err)


def test_spare_gpus_are_refused_with_the_modes_to_pick():
    err = _error(LaunchSpec(T2V, gpus=(0, 1)))
    assert err.setting == "parallel_mode" and "cfg" in err.fix and "ulysses" in err.fix


def test_world_size_against_visible_gpus():
    err = _error(LaunchSpec(T2V, parallel=ParallelConfig("ulysses", 2)), visible=1)
    assert "this machine shows 1" in str(err)
    LaunchSpec(T2V, parallel=ParallelConfig("ulysses", 2)).validate(visible_gpus=2)


def test_layerwise_offload_with_parallelism():
    err = _error(LaunchSpec(T2V, gpus=(0, 1), parallel=ParallelConfig("cfg", 2), memory=MemoryConfig("layerwise")))
    assert err.setting == "offload" and "module" in err.fix


def test_tp_with_hsdp():
    err = _error(LaunchSpec(T2V, gpus=(0, 1), parallel=ParallelConfig("tensor", 2, hsdp=True)))
    assert "HSDP (FSDP2) is not compatible with TP" in str(err)


@pytest.mark.parametrize("model, degree", [(T2V, 3), (TI2V, 5), (I2V, 3)])
def test_ulysses_degree_must_divide_heads_in_strict_mode(model, degree):
    spec = LaunchSpec(model, gpus=tuple(range(degree)), parallel=ParallelConfig("ulysses", degree))
    err = _error(spec)
    assert "attention heads" in str(err) and "advanced_uaa" in err.fix
    LaunchSpec(model, gpus=tuple(range(degree)),
               parallel=ParallelConfig("ulysses", degree, ulysses_mode="advanced_uaa")).validate()


VACE_1_3B = "Wan-AI/Wan2.1-VACE-1.3B-diffusers"


@pytest.mark.parametrize("model, degree", [(T2V, 3), (T2V, 5), (T2V, 6), (TI2V, 3), (TI2V, 6), (VACE_1_3B, 8)])
def test_tensor_parallel_degree_must_split_heads_and_ffn_evenly(model, degree):
    """vLLM's parallel linear layers refuse an uneven split at load: T2V-A14B's 40 heads by 3, TI2V-5B's
    14336-wide feed-forward by 3 (its 24 heads would split), VACE-1.3B's 12 heads by 8."""
    err = _error(LaunchSpec(model, gpus=tuple(range(degree)), parallel=ParallelConfig("tensor", degree)))
    assert f"Tensor parallel degree {degree}" in err.what and "attention heads" in err.why
    assert err.setting == "parallel_degree" and "parallel_degree" in err.fix and "--parallel tensor=2" in err.fix


@pytest.mark.parametrize("model, degree", [(T2V, 2), (T2V, 4), (T2V, 8), (TI2V, 8), (VACE_1_3B, 4)])
def test_tensor_parallel_degrees_that_split_evenly_validate(model, degree):
    LaunchSpec(model, gpus=tuple(range(degree)), parallel=ParallelConfig("tensor", degree)).validate()


def test_tensor_parallel_degrees_follow_the_familys_own_feed_forward_width():
    """The rule reads the family's heads and ffn_dim, so it is exact for a shape no Wan repo has: 40 heads and a
    13820-wide feed-forward (4 x 5 x 691) split by 2, 4 and 5, never by 8 (which the heads alone would allow)."""
    family = replace(FAMILIES["t2v_a14b"], ffn_dim=13820)
    assert tensor_parallel_degrees(family) == [2, 4, 5]
    check_parallel(ParallelConfig("tensor", 5), family)
    with pytest.raises(SpecError) as caught:
        check_parallel(ParallelConfig("tensor", 8), family)
    assert "Tensor parallel degree 8" in caught.value.what and "13820-wide feed-forward" in caught.value.why
    assert "[2, 4, 5]" in caught.value.fix


def test_unknown_model_family():
    err = _error(LaunchSpec("stabilityai/sdxl"))
    assert err.setting == "model" and "Wan2.2" in str(err)


def test_local_folder_model_is_recognised(tmp_path):
    (tmp_path / "model_index.json").write_text(json.dumps({"_class_name": "WanPipeline", "expand_timesteps": True}))
    assert LaunchSpec(str(tmp_path)).family.key == "ti2v_5b"


def test_local_folder_without_model_index(tmp_path):
    err = _error(LaunchSpec(str(tmp_path)))
    assert "model_index.json" in str(err) and "Diffusers" in str(err)


@pytest.mark.parametrize("flag", sorted(NONEXISTENT_FLAGS))
def test_blog_post_flags_are_rejected_by_name_with_the_real_equivalent(flag):
    err = _error(LaunchSpec(T2V, extra_flags=(flag,)))
    assert f"Flag {flag} does not exist" in str(err)
    assert NONEXISTENT_FLAGS[flag] in err.fix


@pytest.mark.parametrize("flag", ["--trust-remote-code", "--host=0.0.0.0", "--api-key=x", "--deploy-config=a.yaml"])
def test_local_only_flags_cannot_come_from_a_workflow(flag):
    err = _error(LaunchSpec(T2V, extra_flags=(flag,)))
    assert "cannot be set from a workflow" in str(err)


def test_owned_flags_point_to_the_setting():
    err = _error(LaunchSpec(T2V, extra_flags=("--usp", "2")))
    assert "parallel mode 'ulysses'" in err.fix


def test_extra_flag_allow_list_and_versions():
    LaunchSpec(T2V, extra_flags=("--max-num-seqs", "2", "--vae-fast-path=lossless")).validate()
    with pytest.raises(SpecError, match="needs vLLM-Omni 0.30"):
        LaunchSpec(T2V, extra_flags=("--vae-fast-path=lossless",)).validate(version=(0, 26))
    with pytest.raises(SpecError, match="not on the launcher's allow-list"):
        LaunchSpec(T2V, extra_flags=("--enable-lora",)).validate()
    with pytest.raises(SpecError, match="needs a value"):
        LaunchSpec(T2V, extra_flags=("--max-num-seqs",)).validate()


def test_cfg_parallel_must_be_two():
    err = _error(LaunchSpec(T2V, gpus=(0, 1, 2, 3), parallel=ParallelConfig("cfg", 4)))
    assert "exactly two passes" in str(err)


def test_vae_patch_inside_world():
    err = _error(LaunchSpec(T2V, parallel=ParallelConfig("none", 1, vae_patch=2)))
    assert err.setting == "vae_patch_parallel"


def test_fp8_is_allowed_with_a_warning():
    warnings = LaunchSpec(T2V, memory=MemoryConfig(quantization="fp8")).validate()
    assert any("FP8" in w for w in warnings)


def test_fingerprint_changes_with_settings_and_round_trips():
    a = LaunchSpec(T2V, gpus=(0, 1), parallel=ParallelConfig("cfg", 2))
    assert a.fingerprint() == LaunchSpec.from_dict(json.loads(json.dumps(a.to_dict()))).fingerprint()
    assert a.fingerprint() != a.with_changes(parallel=ParallelConfig("ulysses", 2)).fingerprint()


def test_parse_helpers():
    assert parse_gpus("all") is None and parse_gpus("0, 1") == (0, 1)
    assert parse_parallel("usp=2") == ("ulysses", 2) and parse_parallel("none") == ("none", 1)
    assert parse_parallel("cfg") == ("cfg", 2)
    with pytest.raises(SpecError):
        parse_parallel("pipeline=2")


def test_argv_cli_prints_json_with_secrets_masked():
    out = subprocess.run([sys.executable, "-m", "vllm_omni_launcher", "argv", "--model", T2V, "--gpus", "0,1",
                          "--parallel", "ulysses=2", "--json"], capture_output=True, text=True, check=True)
    data = json.loads(out.stdout)
    assert data["argv"][1:5] == ["serve", T2V, "--omni", "--usp"]
    assert data["env"] == {"CUDA_VISIBLE_DEVICES": "0,1", "VLLM_API_KEY": "***"}


def test_argv_cli_reports_validation_errors_as_text():
    out = subprocess.run([sys.executable, "-m", "vllm_omni_launcher", "argv", "--model", T2V,
                          "--extra-flag=--model-type=wan2_2"], capture_output=True, text=True)
    assert out.returncode == 1 and "--model-type does not exist" in out.stderr and "Traceback" not in out.stderr
