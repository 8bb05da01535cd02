"""Fuse LoRA files with the REAL vLLM-Omni 0.30 distill loader on CPU and compare what they add (server side).

Both functions run inside ``upstream_resolve.py`` (server python), which calls them by name, so
they share the session's resolver process (and its vLLM import) with the other checks:

* ``{"call": "lora_strength_check:make", "input": {"model_dir": DIR, "out": FILE}}`` writes the
  ComfyUI-format LoRA bench/make_tiny_lora.py makes for ``DIR/transformer`` (lora_down, lora_up,
  alpha: the lightx2v layout) and returns ``{"out": FILE}``;
* ``{"call": "lora_strength_check:fuse", "input": {"model_dir": DIR, "base": FILE,
  "scaled": [[STRENGTH, FILE], ...]}}`` builds vLLM-Omni's own WanTransformer3DModel from
  ``DIR/transformer`` (as lora_loader_check.py does), zeroes every parameter, and fuses each file
  through ``WanLoraLoaderMixin.load_lora_weights`` (diffusers' Wan converter with its alpha/rank,
  vLLM-Omni's remapping and fusing): on zero weights, what the loader adds is exactly the
  parameters afterwards.  For each scaled file it compares that delta with STRENGTH times the
  base file's, and returns::

    {"changed": N, "files": [{"strength": S, "exact": bool, "max_rel_err": x, "same_params": bool}, ...]}

The distributed seams are lora_loader_check.py's, set up for the fuse only and put back after it.
"""
from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
for _path in (HERE, HERE.parents[1] / "bench"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))


def make(spec: dict) -> dict:
    """The tiny TI2V transformer's ComfyUI-format LoRA at ``spec["out"]``."""
    from make_tiny_lora import make_comfy_lora

    make_comfy_lora(Path(spec["model_dir"]), Path(spec["out"]), expert="transformer")
    return {"out": spec["out"]}


def _fused_delta(model_dir: Path, file: str) -> dict:
    import torch
    from lora_loader_check import transformer
    from vllm_omni.diffusion.lora.loader import WanLoraLoaderMixin

    module = transformer(model_dir / "transformer")
    with torch.no_grad():
        for p in module.parameters():
            p.zero_()

    def init(self: object) -> None:
        self.transformer = module

    # The converter is looked up by the pipeline's class name, as for the real Wan22Pipeline.
    pipeline = type("Wan22Pipeline", (WanLoraLoaderMixin,), {"has_transformer_2": False, "__init__": init})()
    pipeline.load_lora_weights([file], adapter_name=Path(file).stem)
    return {n: p.detach().clone() for n, p in module.named_parameters() if bool(p.detach().abs().sum() > 0)}


def fuse(spec: dict) -> dict:
    """What each scaled file adds, against its strength times what ``spec["base"]`` adds."""
    from lora_loader_check import single_process_groups

    model_dir = Path(spec["model_dir"])
    with single_process_groups():
        reference = _fused_delta(model_dir, spec["base"])
        files = []
        for strength, path in spec["scaled"]:
            delta = _fused_delta(model_dir, path)
            same_params = sorted(delta) == sorted(reference)
            exact = same_params and all(bool((delta[n] == reference[n] * strength).all()) for n in reference)
            err = max(float(((delta[n] - reference[n] * strength).abs().max() /
                             (reference[n] * strength).abs().max())) for n in reference) if same_params else None
            files.append({"strength": strength, "exact": exact, "max_rel_err": err, "same_params": same_params})
    return {"changed": len(reference), "files": files}
