"""Fused LoRA strengths other than 1 against the real vLLM-Omni 0.30 loader (issue 13).

The launcher serves strength S of a single-file LoRA by fusing a scaled copy (server/launch/lora_files.py).
Here the copy is made by the launcher's own code from the ComfyUI-format LoRA bench/make_tiny_lora.py
writes for the tiny Wan2.2 TI2V transformer, and the real distill loader (diffusers' Wan converter
with alpha/rank, vLLM-Omni's fusing) fuses both on CPU (lora_strength_check.py, run in the session's
resolver process): the x2 copy adds exactly twice what the original adds, and x2.5 adds 2.5 times it
up to bf16 rounding.
"""
from __future__ import annotations

from pathlib import Path

from stubserver import Resolver
from vllm_omni_launcher.models import FAMILIES
from vllm_omni_launcher.server.launch.loras import LoraEntry, plan_loras

HERE = Path(__file__).resolve().parent
TINY = HERE / "fixtures" / "lora" / "tiny-wan22-ti2v"


def _check(resolver: Resolver, function: str, spec: dict) -> dict:
    [answer] = resolver.resolve([{"call": f"lora_strength_check:{function}", "input": spec}], timeout=900)
    assert "call_error" not in answer, answer.get("call_error")
    return answer


def test_a_scaled_copy_fuses_to_strength_times_the_delta_of_the_original(upstream_resolver, tmp_path):
    base = tmp_path / "loras" / "light.safetensors"
    assert _check(upstream_resolver, "make", {"model_dir": str(TINY), "out": str(base)}) == {"out": str(base)}
    data = str(tmp_path / "data")
    family = FAMILIES["ti2v_5b"]
    copies = {s: plan_loras([LoraEntry(str(base), s)], family, (0, 30), data_dir=data).startup.lora_paths[0]
              for s in (2.0, 2.5)}
    assert all(Path(p).parent == tmp_path / "data" / "loras" for p in copies.values())
    report = _check(upstream_resolver, "fuse",
                    {"model_dir": str(TINY), "base": str(base), "scaled": [[s, p] for s, p in copies.items()]})
    assert report["changed"] > 0
    x2, x25 = report["files"]
    assert x2["strength"] == 2.0 and x2["exact"], x2
    assert x25["same_params"] and x25["max_rel_err"] < 1e-2, x25
