"""Make small LoRAs for a (tiny) Wan2.2 transformer, in the two formats people have on disk.

* `peft`: a PEFT folder (adapter_config.json + adapter_model.safetensors) written by peft itself
  from the diffusers WanTransformer3DModel of the model folder. This is what vLLM-Omni's
  per-request `lora` field (0.26 and 0.30) and `--lora-backend peft` load.
* `comfy`: one ComfyUI / original-Wan single-file LoRA (`diffusion_model.blocks.N.self_attn.q.
  lora_down.weight`, `lora_up.weight`, `alpha`), the layout of the lightx2v distill LoRAs. 0.30's
  `--lora-backend distill` converts it with diffusers' Wan converter and fuses it at startup.

Weights are random (seeded) and not small, so a LoRA visibly changes the output of a
random-weight model. Needs torch + safetensors; `peft` also needs peft and diffusers (the server
venv has them; so does the GPU kit). Runs on CPU in a second for the tiny models.

usage:
  python bench/make_tiny_lora.py peft  --model MODEL_DIR --out FOLDER [--rank 8] [--expert transformer]
  python bench/make_tiny_lora.py comfy --model MODEL_DIR --out FILE.safetensors [--rank 8]
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Sequence

# Cross-attention q/k/v: plain linear layers in vLLM-Omni's Wan transformer on every version,
# so a PEFT adapter on them binds without relying on the packed (fused QKV) self-attention path.
PEFT_TARGETS = ("attn2.to_q", "attn2.to_k", "attn2.to_v")

# original Wan / ComfyUI module name -> diffusers module name (as diffusers' converter maps them)
COMFY_TO_DIFFUSERS = {
    "self_attn.q": "attn1.to_q", "self_attn.k": "attn1.to_k", "self_attn.v": "attn1.to_v",
    "self_attn.o": "attn1.to_out.0",
    "cross_attn.q": "attn2.to_q", "cross_attn.k": "attn2.to_k", "cross_attn.v": "attn2.to_v",
    "cross_attn.o": "attn2.to_out.0",
    "ffn.0": "ffn.net.0.proj", "ffn.2": "ffn.net.2",
}


def make_peft_lora(model_dir: Path, out_dir: Path, *, expert: str = "transformer", rank: int = 8,
                   seed: int = 0, targets: Sequence[str] = PEFT_TARGETS) -> Path:
    """Write a PEFT LoRA for `model_dir/<expert>` (its config.json) into `out_dir`; returns out_dir."""
    import torch
    from diffusers import WanTransformer3DModel
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    # The adapter's shapes depend on the config only, so the base weights are not loaded.
    base = WanTransformer3DModel.from_config(WanTransformer3DModel.load_config(str(Path(model_dir) / expert)))
    # init_lora_weights=False: B is random too (peft's default zeros B, an adapter with no effect).
    config = LoraConfig(r=rank, lora_alpha=rank, target_modules=list(targets), init_lora_weights=False)
    peft_model = get_peft_model(base, config)
    out_dir.mkdir(parents=True, exist_ok=True)
    peft_model.save_pretrained(str(out_dir))
    return out_dir


def comfy_lora_shapes(config: dict) -> dict[str, tuple[int, int]]:
    """(out, in) of every linear a ComfyUI Wan LoRA covers in one block, from a transformer config.json:
    attention q/k/v/o are hidden x hidden (text is projected to hidden before cross-attention), the FFN
    is hidden -> ffn_dim -> hidden."""
    hidden, ffn = int(config["num_attention_heads"]) * int(config["attention_head_dim"]), int(config["ffn_dim"])
    shapes = {name: (hidden, hidden) for name in COMFY_TO_DIFFUSERS if "attn" in name}
    return {**shapes, "ffn.0": (ffn, hidden), "ffn.2": (hidden, ffn)}


def make_comfy_lora(model_dir: Path, out_file: Path, *, expert: str = "transformer", rank: int = 8,
                    seed: int = 0) -> Path:
    """Write a ComfyUI-format single-file LoRA covering every attention and FFN linear of every
    block of `model_dir/<expert>` (shapes from its config.json). Returns out_file."""
    import torch
    from safetensors.torch import save_file

    config = json.loads((Path(model_dir) / expert / "config.json").read_text())
    gen = torch.Generator().manual_seed(seed)
    tensors: dict[str, torch.Tensor] = {}
    for i in range(int(config["num_layers"])):
        for comfy, (out_features, in_features) in comfy_lora_shapes(config).items():
            prefix = f"diffusion_model.blocks.{i}.{comfy}"
            tensors[f"{prefix}.lora_down.weight"] = torch.randn(rank, in_features, generator=gen) / in_features ** 0.5
            tensors[f"{prefix}.lora_up.weight"] = torch.randn(out_features, rank, generator=gen) / rank ** 0.5
            tensors[f"{prefix}.alpha"] = torch.tensor(float(rank))
    out_file.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous().to(torch.bfloat16) for k, v in tensors.items()}, str(out_file))
    return out_file


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("format", choices=("peft", "comfy"))
    parser.add_argument("--model", required=True, type=Path, help="Diffusers model folder (tiny Wan2.2)")
    parser.add_argument("--out", required=True, type=Path, help="PEFT folder, or the .safetensors file")
    parser.add_argument("--expert", default="transformer", choices=("transformer", "transformer_2"))
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.format == "peft":
        out = make_peft_lora(args.model, args.out, expert=args.expert, rank=args.rank, seed=args.seed)
    else:
        out = make_comfy_lora(args.model, args.out, expert=args.expert, rank=args.rank, seed=args.seed)
    print(json.dumps({"format": args.format, "out": str(out)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
