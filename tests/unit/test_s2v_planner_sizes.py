"""The planner sizes S2V as upstream loads it: the wav2vec2 audio encoder resident at its checkpoint's dtype,
S2V's original layout read from its own files, and the pipeline families' DiT parameter counts as the real
checkpoints have them (bench/gpu/manifest_<family>.json: counted off the upstream classes at the real configs);
the doctor checks an original-layout folder by those files and reports the same sizes."""
from __future__ import annotations

import json
import subprocess
import math
import os
import struct
from pathlib import Path

import pytest

from fake_nvml import broken_nvml
from vllm_omni_launcher.models import ALL_FAMILIES, PIPELINE_FAMILIES
from vllm_omni_launcher.planner.doctor import run_doctor
from vllm_omni_launcher.planner.doctor_report import OK, PROBLEM
from vllm_omni_launcher.planner.memory import RequestShape, plan
from vllm_omni_launcher.planner.model_sizes import GIB, builtin_sizes, model_sizes
from vllm_omni_launcher.server.launch.spec import LaunchSpec, MemoryConfig

ROOT = Path(__file__).resolve().parents[2]
S2V = PIPELINE_FAMILIES["s2v_14b"]
S2V_CONFIG = ROOT / "tests" / "contract" / "fixtures" / "hf" / "Wan-AI" / "Wan2.2-S2V-14B" / "config.json"
AUDIO = "wav2vec2-large-xlsr-53-english"


def _manifest_params(name: str, part: str) -> float:
    doc = json.loads((ROOT / "bench" / "gpu" / f"manifest_{name}.json").read_text())
    [found] = [p for p in doc["parts"] if p["name"] == part]
    return float(sum(math.prod(shape) for _, shape, _ in found["tensors"]))


def _audio_term(p):
    return [t for t in p.gpus[0].terms if t.name == "audio encoder"]


@pytest.mark.parametrize("key", ["vace_14b", "vace_1_3b", "s2v_14b", "fastwan_ti2v_5b"])
def test_pipeline_dit_parameters_match_the_real_checkpoints(key):
    assert ALL_FAMILIES[key].dit_params_b * 1e9 == pytest.approx(_manifest_params(key, "transformer"), rel=0.003)


def test_s2v_plan_holds_the_fp32_audio_encoder_resident_even_with_offload():
    sizes = builtin_sizes(S2V)
    assert sizes.audio_encoder_params == pytest.approx(_manifest_params("s2v_14b", "audio_encoder"), rel=0.001)
    assert sizes.audio_encoder_bytes == 4 and sizes.audio_encoder_gib == pytest.approx(1.175, abs=0.005)
    for offload in ("none", "module", "layerwise"):
        p = plan(LaunchSpec(S2V.hf_id, memory=MemoryConfig(offload=offload)), gpus=[80.0], host_available_gib=None)
        [term] = _audio_term(p)
        assert term.phase == "resident" and term.gib == pytest.approx(sizes.audio_encoder_gib)
        without = sum(t.gib for t in p.gpus[0].terms if t.phase == "resident" and t.name != "audio encoder")
        assert p.gpus[0].phases["resident"] == pytest.approx(without + term.gib)
    assert p.to_dict()["sizes"]["audio_encoder_gib"] == pytest.approx(1.175, abs=0.005)


def test_other_families_have_no_audio_encoder():
    for family in ALL_FAMILIES.values():
        if family.pipeline != "s2v":
            assert not _audio_term(plan(LaunchSpec(family.hf_id), gpus=[80.0], host_available_gib=None))


def _safetensors(path: Path, tensors: dict[str, tuple[list[int], str]]) -> None:
    header = json.dumps({name: {"dtype": dtype, "shape": shape, "data_offsets": [0, 0]}
                         for name, (shape, dtype) in tensors.items()}).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(struct.pack("<Q", len(header)) + header)


def _sized(path: Path, nbytes: int) -> None:
    with path.open("wb") as fh:
        fh.truncate(nbytes)


def _s2v_folder(root: Path, audio_dtype: str = "F32", config_dtype: str = "") -> Path:
    root.mkdir(parents=True)
    (root / "config.json").write_text(S2V_CONFIG.read_text())
    _safetensors(root / "diffusion_pytorch_model-00001-of-00002.safetensors", {"a": ([1000, 1000], "BF16")})
    _safetensors(root / "diffusion_pytorch_model-00002-of-00002.safetensors", {"b": ([500, 1000], "BF16")})
    _sized(root / "models_t5_umt5-xxl-enc-bf16.pth", 2 * 3_000_000)
    _sized(root / "Wan2.1_VAE.pth", 4 * 100_000)
    _safetensors(root / AUDIO / "model.safetensors", {"w": ([2000, 1000], audio_dtype)})
    (root / AUDIO / "config.json").write_text(json.dumps({"torch_dtype": config_dtype} if config_dtype else {}))
    (root / "google" / "umt5-xxl").mkdir(parents=True)
    return root


def test_s2v_original_layout_is_read_from_its_own_files(tmp_path):
    s = model_sizes(str(_s2v_folder(tmp_path / "s2v")))
    assert "original layout" in s.source and not s.notes
    assert s.dit_params == (1_500_000.0,) and s.text_encoder_params == 3_000_000 and s.vae_params == 100_000
    assert (s.dit.layers, s.dit.heads, s.dit.head_dim, s.dit.ffn_dim, s.dit.in_channels) == (40, 40, 128, 13824, 16)
    assert s.audio_encoder_params == 2_000_000 and s.audio_encoder_gib == 8_000_000 / GIB    # fp32 as stored
    p = plan(LaunchSpec(str(tmp_path / "s2v")), RequestShape(832, 448, 80), [80.0], host_available_gib=None)
    assert _audio_term(p)[0].gib == 8_000_000 / GIB


@pytest.mark.parametrize("stored,named,nbytes", [("BF16", "", 2), ("F32", "bfloat16", 2), ("BF16", "float32", 4)])
def test_the_audio_encoder_takes_its_configs_dtype_else_its_weights(tmp_path, stored, named, nbytes):
    """transformers 5's from_pretrained without a dtype ("auto"): the config's dtype, else the weights' own."""
    s = model_sizes(str(_s2v_folder(tmp_path / "s2v", stored, named)))
    assert s.audio_encoder_bytes == nbytes


def test_a_partial_s2v_folder_falls_back_to_the_table_and_says_so(tmp_path):
    folder = _s2v_folder(tmp_path / "s2v")
    for f in [*folder.glob("diffusion_pytorch_model*"), folder / AUDIO / "model.safetensors"]:
        os.unlink(f)
    s = model_sizes(str(folder))
    table = builtin_sizes(S2V)
    assert s.dit_params == table.dit_params and s.audio_encoder_params == table.audio_encoder_params
    assert any(n.startswith("diffusion_pytorch_model-*.safetensors is not there yet") for n in s.notes)
    assert any(n.startswith(f"{AUDIO}/ is not there yet") for n in s.notes)


def _no_env_script(cmd, **kwargs):
    """The doctor's server-environment script is not what these tests check: it is not run."""
    return subprocess.CompletedProcess(cmd, 1, stdout="", stderr="not run by this test")


def test_doctor_checks_an_s2v_original_folder_by_its_own_files(tmp_path):
    folder = _s2v_folder(tmp_path / "s2v")
    check = run_doctor(str(folder), nvml=broken_nvml(), runner=_no_env_script).check("model")
    assert check.status == OK and "(original layout)" in check.summary and "0.0 GiB audio encoder" in check.summary
    (folder / "models_t5_umt5-xxl-enc-bf16.pth").unlink()
    check = run_doctor(str(folder), nvml=broken_nvml(), runner=_no_env_script).check("model")
    assert check.status == PROBLEM and "missing models_t5_umt5-xxl-enc-bf16.pth" in check.summary
    assert f"huggingface-cli download {S2V.hf_id} --local-dir {folder}" in check.fix
