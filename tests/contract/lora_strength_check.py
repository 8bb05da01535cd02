#!/usr/bin/env python3
"""Fuse LoRA files with the REAL vLLM-Omni 0.30 distill loader on CPU and compare what they add (server python).

    python tests/contract/lora_strength_check.py make MODEL_DIR OUT_FILE
    python tests/contract/lora_strength_check.py fuse MODEL_DIR BASE_FILE STRENGTH SCALED_FILE [STRENGTH FILE ...]

`make` writes the ComfyUI-format LoRA bench/make_tiny_lora.py makes for MODEL_DIR/transformer
(lora_down, lora_up, alpha: the lightx2v layout). `fuse` builds vLLM-Omni's own
WanTransformer3DModel from MODEL_DIR/transformer (as lora_loader_check.py does), zeroes every
parameter, and fuses each file through `WanLoraLoaderMixin.load_lora_weights` (diffusers' Wan
converter with its alpha/rank, vLLM-Omni's remapping and fusing): on zero weights, what the
loader adds is exactly the parameters afterwards. For each scaled file it compares that delta
with STRENGTH times the base file's. One JSON line on stdout:

    {"changed": N, "files": [{"strength": S, "exact": bool, "max_rel_err": x}, ...]}
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1] / "bench"))


def _make(model_dir: Path, out: Path) -> int:
    from make_tiny_lora import make_comfy_lora

    make_comfy_lora(model_dir, out, expert="transformer")
    print(json.dumps({"out": str(out)}))
    return 0


def _fused_delta(model_dir: Path, file: str) -> dict:
    import torch
    from lora_loader_check import _transformer
    from vllm_omni.diffusion.lora.loader import WanLoraLoaderMixin

    module = _transformer(model_dir / "transformer")
    with torch.no_grad():
        for p in module.parameters():
            p.zero_()

    def init(self: object) -> None:
        self.transformer = module

    # The converter is looked up by the pipeline's class name, as for the real Wan22Pipeline.
    pipeline = type("Wan22Pipeline", (WanLoraLoaderMixin,), {"has_transformer_2": False, "__init__": init})()
    pipeline.load_lora_weights([file], adapter_name=Path(file).stem)
    return {n: p.detach().clone() for n, p in module.named_parameters() if bool(p.detach().abs().sum() > 0)}


def _fuse(model_dir: Path, base: str, scaled: list[tuple[float, str]]) -> int:
    from lora_loader_check import _single_process_groups

    _single_process_groups()
    reference = _fused_delta(model_dir, base)
    files = []
    for strength, path in scaled:
        delta = _fused_delta(model_dir, path)
        same_params = sorted(delta) == sorted(reference)
        exact = same_params and all(bool((delta[n] == reference[n] * strength).all()) for n in reference)
        err = max(float(((delta[n] - reference[n] * strength).abs().max() /
                         (reference[n] * strength).abs().max())) for n in reference) if same_params else None
        files.append({"strength": strength, "exact": exact, "max_rel_err": err, "same_params": same_params})
    print(json.dumps({"changed": len(reference), "files": files}))
    sys.stdout.flush()
    os._exit(0)        # skip the process-group teardown (nothing to clean up in a one-shot check)


def main() -> int:
    command, model_dir = sys.argv[1], Path(sys.argv[2])
    if command == "make":
        return _make(model_dir, Path(sys.argv[3]))
    rest = sys.argv[4:]
    return _fuse(model_dir, sys.argv[3], [(float(rest[i]), rest[i + 1]) for i in range(0, len(rest), 2)])


if __name__ == "__main__":
    raise SystemExit(main())
