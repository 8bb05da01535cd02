"""Load a built pipeline folder the way vLLM-Omni 0.30's pipeline does, on CPU and offline: `python -m
bench.gpu.pipeline_load_check <folder>` under the server venv, with HF_HUB_OFFLINE=1 and (S2V) HF_HOME = the
builder's `hf-home/`. The rehearsal runs it on each tiny folder: the stub server never opens weights, so this is
where the layout meets upstream's loaders before a GPU does. The transformer is built on the CPU, so run this
at tiny sizes only.

Each step is upstream's own call. Diffusers layout (VACE, FastWan; `Wan22Pipeline.__init__`): the tokenizer and
`UMT5EncoderModel` from their subfolders, the VAE through diffusers'
`AutoencoderKLWan.from_pretrained(subfolder="vae")` (vLLM-Omni's subclass joins a process group after it), the
transformer from `load_transformer_config` through `create_vace_transformer_from_config` /
`create_transformer_from_config` and its `load_weights` over the safetensors. S2V's original layout
(`Wan22S2VPipeline._init_original_format`): the tokenizer from `google/umt5-xxl`, the Wan T5 .pth through
`_load_wan_t5_as_umt5` (a strict load: every UMT5 tensor), the VAE .pth through
`DistributedAutoencoderKLWan.from_single_file` (its config from the HF cache), wav2vec2's processor and CTC
model, the transformer through its `load_weights` from the shards. Passes when every transformer parameter
was loaded and every tensor of its files taken.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Iterator


def _safetensors(folder: Path) -> Iterator[tuple[str, Any]]:
    from safetensors import safe_open

    for path in sorted(folder.glob("*.safetensors")):
        with safe_open(str(path), "pt") as f:
            for key in f.keys():
                yield key, f.get_tensor(key)


def _transformer_loads(model: Any, folder: Path) -> dict:
    """Every parameter loaded (one pass over the files, as the server's loader does), and every tensor of the
    files taken (each offered alone: one the loader skips as unknown loads nothing)."""
    loaded = model.load_weights(_safetensors(folder))
    missing = [n for n, _ in model.named_parameters() if n not in loaded]
    tensors = list(_safetensors(folder))
    unused = [name for name, tensor in tensors if not model.load_weights([(name, tensor)])]
    return {"parameters": sum(1 for _ in model.named_parameters()), "tensors": len(tensors), "missing": missing[:5],
            "unused": unused[:5], "loaded_all": not missing and not unused}


def check_diffusers(folder: Path) -> dict:
    import torch
    from transformers import AutoTokenizer, UMT5EncoderModel
    from vllm_omni.diffusion.models.wan2_2 import pipeline_wan2_2, pipeline_wan2_2_vace, wan2_2_transformer
    from diffusers import AutoencoderKLWan

    from .pipeline_manifest import vllm_omni_stand_ins

    tokenizer = AutoTokenizer.from_pretrained(str(folder), subfolder="tokenizer")
    out: dict[str, Any] = {"tokenizer_vocab": tokenizer.vocab_size}
    te = UMT5EncoderModel.from_pretrained(str(folder), subfolder="text_encoder", torch_dtype=torch.bfloat16)
    out["text_encoder_params"] = sum(p.numel() for p in te.parameters())
    # vLLM-Omni's DistributedAutoencoderKLWan is this class plus a process group it joins after loading
    vae = AutoencoderKLWan.from_pretrained(str(folder), subfolder="vae", torch_dtype=torch.bfloat16)
    out["vae"] = {"z_dim": vae.config.z_dim, "base_dim": vae.config.base_dim}
    vllm_omni_stand_ins(wan2_2_transformer)
    config = pipeline_wan2_2.load_transformer_config(str(folder), "transformer", local_files_only=True)
    index = json.loads((folder / "model_index.json").read_text())
    create = pipeline_wan2_2_vace.create_vace_transformer_from_config \
        if index["_class_name"] == "WanVACEPipeline" else pipeline_wan2_2.create_transformer_from_config
    with torch.device("cpu"):
        model = create(config)
    out["transformer"] = _transformer_loads(model, folder / "transformer")
    return out


def check_s2v(folder: Path) -> dict:
    import torch
    from transformers import AutoTokenizer, UMT5Config, UMT5EncoderModel, Wav2Vec2ForCTC, Wav2Vec2Processor
    from vllm_omni.diffusion.models.wan2_2 import pipeline_wan2_2_s2v as s2v
    from vllm_omni.diffusion.models.wan2_2.pipeline_wan2_2_s2v import DistributedAutoencoderKLWan

    from .pipeline_manifest import s2v_transformer

    tokenizer = AutoTokenizer.from_pretrained(str(folder / "google" / "umt5-xxl"))
    out: dict[str, Any] = {"tokenizer_vocab": tokenizer.vocab_size}
    ckpt = folder / "models_t5_umt5-xxl-enc-bf16.pth"
    t5 = torch.load(str(ckpt), map_location="meta", weights_only=True)     # its sizes (the tiny stand-in or XXL)
    heads = t5["blocks.0.pos_embedding.embedding.weight"].shape[1]
    cfg = UMT5Config(**dict(s2v._WAN_UMT5_CONFIG.to_dict(), vocab_size=t5["token_embedding.weight"].shape[0],
                            d_model=t5["token_embedding.weight"].shape[1], d_ff=t5["blocks.0.ffn.fc1.weight"].shape[0],
                            num_heads=heads, d_kv=t5["blocks.0.attn.q.weight"].shape[0] // heads))
    te = s2v._load_wan_t5_as_umt5(UMT5EncoderModel(cfg), str(ckpt))
    out["text_encoder_params"] = sum(p.numel() for p in te.parameters())
    vae = DistributedAutoencoderKLWan.from_single_file(str(folder / "Wan2.1_VAE.pth"), torch_dtype=torch.bfloat16)
    out["vae"] = {"z_dim": vae.config.z_dim, "base_dim": vae.config.base_dim}
    w2v = folder / "wav2vec2-large-xlsr-53-english"
    Wav2Vec2Processor.from_pretrained(str(w2v))
    out["audio_encoder_params"] = sum(p.numel() for p in Wav2Vec2ForCTC.from_pretrained(str(w2v)).parameters())
    model = s2v_transformer(json.loads((folder / "config.json").read_text()), "cpu")
    out["transformer"] = _transformer_loads(model, folder)
    return out


if __name__ == "__main__":
    folder = Path(sys.argv[1])
    result = check_diffusers(folder) if (folder / "model_index.json").is_file() else check_s2v(folder)
    print("LOAD " + json.dumps(result), flush=True)
    sys.exit(0 if result["transformer"]["loaded_all"] else 1)
