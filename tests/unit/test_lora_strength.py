"""Fused single-file LoRAs at strengths other than 1 (issue 13): a scaled copy of the file, made once
in the launcher's data dir, with only the up weights and deltas multiplied, named by the source and
the strength (so the strength stays part of the server's fingerprint), written atomically and
privately, and at most KEEP of them kept."""
from __future__ import annotations

import json
import os
import stat
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from vllm_omni_launcher.errors import LauncherError
from vllm_omni_launcher.models import FAMILIES
from vllm_omni_launcher.server.launch import lora_files
from vllm_omni_launcher.server.launch.lora_files import KEEP, read_header, scaled_lora
from vllm_omni_launcher.server.launch.loras import LoraEntry, plan_loras, serving_note
from vllm_omni_launcher.server.launch.spec import LaunchSpec

A14B, TI2V = FAMILIES["t2v_a14b"], FAMILIES["ti2v_5b"]
V30 = (0, 30)
TORCH_DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}
UP, DOWN, ALPHA = ("diffusion_model.blocks.0.self_attn.q.lora_up.weight",
                   "diffusion_model.blocks.0.self_attn.q.lora_down.weight",
                   "diffusion_model.blocks.0.self_attn.q.alpha")
BIAS = "diffusion_model.blocks.0.self_attn.q.diff_b"


def _write(path: Path, tensors: dict[str, torch.Tensor], dtype_names: dict[str, str]) -> Path:
    """A safetensors file of these tensors (written byte by byte, as the format says)."""
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        data = t.contiguous().view(torch.uint8).numpy().tobytes() if t.dim() else t.reshape(1).view(
            torch.uint8).numpy().tobytes()
        header[name] = {"dtype": dtype_names[name], "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    blob = json.dumps({"__metadata__": {"format": "pt"}, **header}).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + b"".join(blobs))
    return path


def _lora(path: Path, dtype: str = "BF16", seed: int = 0) -> Path:
    gen = torch.Generator().manual_seed(seed)
    td = TORCH_DTYPES[dtype]
    tensors = {DOWN: torch.randn(4, 16, generator=gen).to(td), UP: torch.randn(16, 4, generator=gen).to(td),
               ALPHA: torch.tensor(4.0).to(td), BIAS: torch.randn(16, generator=gen).to(td)}
    return _write(path, tensors, {k: dtype for k in tensors})


def _tensor(path: Path, name: str) -> torch.Tensor:
    header = read_header(path)
    info = header.tensors[name]
    begin, end = info["data_offsets"]
    with open(path, "rb") as f:
        f.seek(header.data_start + begin)
        data = bytearray(f.read(end - begin))
    flat = torch.frombuffer(data, dtype=TORCH_DTYPES[info["dtype"]])
    return flat.reshape(info["shape"]) if info["shape"] else flat[0]


@pytest.mark.parametrize("dtype", ["BF16", "F16", "F32"])
def test_a_scaled_copy_multiplies_only_the_up_weights_and_deltas(tmp_path, dtype):
    src = _lora(tmp_path / "loras" / "light.safetensors", dtype)
    copy = scaled_lora(src, 2.0, str(tmp_path / "data"))
    assert copy.parent == tmp_path / "data" / "loras" and copy.name.startswith("light-") and "x2" in copy.name
    for name in (UP, BIAS):                                          # exactly twice (a power of two)
        assert torch.equal(_tensor(copy, name), _tensor(src, name) * 2)
    for name in (DOWN, ALPHA):                                       # untouched: alpha/rank still applies
        assert torch.equal(_tensor(copy, name), _tensor(src, name))
    header = read_header(copy)
    assert {k: (v["dtype"], v["shape"]) for k, v in header.tensors.items()} == \
        {k: (v["dtype"], v["shape"]) for k, v in read_header(src).tensors.items()}
    assert header.metadata["format"] == "pt" and header.metadata["vllm_omni_launcher.strength"] == "2"
    assert header.data_start % 8 == 0


@pytest.mark.parametrize("dtype", ["BF16", "F16"])
def test_other_strengths_round_to_nearest_like_torch(tmp_path, dtype):
    src = _lora(tmp_path / "a.safetensors", dtype)
    copy = scaled_lora(src, 2.5, str(tmp_path / "data"))
    expected = (_tensor(src, UP).to(torch.float64) * 2.5).to(TORCH_DTYPES[dtype])
    if dtype == "BF16":   # numpy widens bf16 to float32 and rounds back: the float32 product, rounded
        expected = (_tensor(src, UP).to(torch.float32) * np.float32(2.5)).to(torch.bfloat16)
    assert torch.equal(_tensor(copy, UP), expected)


def test_the_copy_is_private_atomic_and_reused_for_the_same_source_and_strength(tmp_path):
    src = _lora(tmp_path / "a.safetensors")
    data = tmp_path / "data"
    first = scaled_lora(src, 3.0, str(data))
    assert stat.S_IMODE(first.stat().st_mode) == 0o600 and stat.S_IMODE((data / "loras").stat().st_mode) == 0o700
    assert [p.name for p in (data / "loras").iterdir()] == [first.name]          # no temporary left behind
    inode = first.stat().st_ino
    assert scaled_lora(src, 3.0, str(data)) == first and first.stat().st_ino == inode   # not written again
    assert scaled_lora(src, 2.0, str(data)) != first                              # another strength
    _lora(src, seed=1)                                                            # the source changed
    os.utime(src, ns=(first.stat().st_mtime_ns + 10**9,) * 2)
    assert scaled_lora(src, 3.0, str(data)) != first


def test_only_the_newest_copies_are_kept(tmp_path):
    src = _lora(tmp_path / "a.safetensors")
    data = str(tmp_path / "data")
    made = []
    for i in range(KEEP + 2):
        made.append(scaled_lora(src, 1.5 + i, data))
        os.utime(made[-1], ns=(10**18 + i * 10**9,) * 2)               # distinct mtimes, oldest first
    kept = sorted(p.name for p in (tmp_path / "data" / "loras").iterdir())
    assert kept == sorted(p.name for p in made[-KEEP:])
    assert scaled_lora(src, 1.5 + len(made) - KEEP, data) == made[-KEEP]    # reusing the oldest makes it newest
    scaled_lora(src, 9.9, data)
    assert made[-KEEP].exists() and not made[-KEEP + 1].exists()


def test_a_failed_copy_leaves_nothing_behind(tmp_path):
    src = _lora(tmp_path / "a.safetensors")
    src.write_bytes(src.read_bytes()[:-8])                                  # truncated
    with pytest.raises(LauncherError) as err:
        scaled_lora(src, 2.0, str(tmp_path / "data"))
    assert "truncated" in err.value.what and list((tmp_path / "data" / "loras").iterdir()) == []


def test_dtypes_the_launcher_cannot_scale_are_refused_naming_strength(tmp_path):
    src = _lora(tmp_path / "a.safetensors")
    header = read_header(src)
    raw = json.dumps({**header.tensors, UP: {**header.tensors[UP], "dtype": "F8_E4M3"}}).encode()
    odd = tmp_path / "fp8.safetensors"
    odd.write_bytes(struct.pack("<Q", len(raw)) + raw + src.read_bytes()[header.data_start:])
    with pytest.raises(LauncherError) as err:
        scaled_lora(odd, 2.0, str(tmp_path / "data"))
    assert err.value.setting == "strength" and "F8_E4M3" in err.value.why and "1.0" in err.value.fix
    assert serving_note(odd, V30) == (True, "single file: fused at startup (strength 1.0 only: its up weights are "
                                            "F8_E4M3; the launcher scales only F64, F32, F16, BF16; a change "
                                            "restarts the server)")
    assert "any strength" in serving_note(src, V30)[1]


def test_plan_fuses_the_scaled_copy_and_the_strength_is_part_of_the_fingerprint(tmp_path):
    hi, lo = _lora(tmp_path / "hi.safetensors"), _lora(tmp_path / "lo.safetensors", seed=1)
    data = str(tmp_path / "data")

    def fused(strength: float) -> LaunchSpec:
        plan = plan_loras([LoraEntry(str(hi), strength, "high_noise"), LoraEntry(str(lo), 1.0, "low_noise")],
                          A14B, V30, data_dir=data)
        return LaunchSpec(A14B.hf_id).with_changes(lora=plan.startup), plan.notes

    (one, _), (three, notes) = fused(1.0), fused(3.0)
    assert one.lora.lora_paths == (str(hi), str(lo))
    high, low = three.lora.lora_paths
    assert Path(high).parent == tmp_path / "data" / "loras" and low == str(lo)
    assert one.fingerprint() != three.fingerprint() != fused(2.0)[0].fingerprint()
    assert fused(3.0)[0].fingerprint() == three.fingerprint()                  # the same choice, the same server
    assert "x3 (a scaled copy)" in notes[0]


def test_plan_uses_the_local_configs_data_dir_when_none_is_given(tmp_path, monkeypatch):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"data_dir": str(tmp_path / "configured")}))
    monkeypatch.setenv("VLLM_OMNI_LAUNCHER_CONFIG", str(cfg))
    monkeypatch.delenv("VLLM_OMNI_LAUNCHER_DATA_DIR", raising=False)
    lora_files_dir = tmp_path / "configured" / "loras"
    plan = plan_loras([LoraEntry(str(_lora(tmp_path / "a.safetensors")), 2.0)], TI2V, V30)
    assert Path(plan.startup.lora_paths[0]).parent == lora_files_dir
    assert lora_files.FOLDER == "loras"
