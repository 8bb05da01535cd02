"""The issue-30 pipelines' tensor manifests, read off the upstream classes on the meta device (server venv:
diffusers 0.40, transformers 5.14, vLLM-Omni 0.30), committed as bench/gpu/manifest_<pipeline>.json.

Where each part's names and shapes come from:

* VACE / FastWan transformer: diffusers' `WanVACETransformer3DModel` / `WanTransformer3DModel` (the classes the
  Diffusers repos were saved with) at the repo's own transformer/config.json (tests/contract/fixtures/hf: the
  real repos' configs; VACE-14B: the 1.3B config with the 14B sizes of pipeline_families.VACE_14B_TRANSFORMER).
* text encoder: transformers' `UMT5EncoderModel` at the repo's text_encoder/config.json (UMT5-XXL), with the
  tied embedding saved once as save_pretrained writes it; one file shared by every Diffusers pipeline.
* VAE: diffusers' `AutoencoderKLWan` at the repo's vae/config.json (Wan2.1 for VACE, Wan2.2 for FastWan).
* S2V-14B (Wan's original layout, no model_index.json; vLLM-Omni's pipeline_wan2_2_s2v.py reads it):
  - `diffusion_pytorch_model-0000N-of-00004.safetensors`: vLLM-Omni's `WanS2VTransformer3DModel` at the repo's
    config.json, its parameter names mapped back to Wan's (the inverse of its `load_weights`: fused to_qkv
    split into q/k/v, to_out -> o, ffn.net_0.proj -> ffn.0, head/time/text embedding names): 1260 tensors,
    16.30 B parameters, as the released checkpoint's index.
  - `models_t5_umt5-xxl-enc-bf16.pth`: UMT5-XXL in Wan's T5 names (the inverse of vLLM-Omni's
    `_convert_wan_t5_state_dict`, checked by running that converter on the result).
  - `Wan2.1_VAE.pth`: Wan's original VAE names = ComfyUI's `comfy.ldm.wan.vae.WanVAE` (dim 96, z_dim 16), as
    manifest_t2v_a14b.json's ComfyUI side holds them, fp32; checked through diffusers'
    `convert_wan_vae_to_diffusers` against `AutoencoderKLWan`. diffusers' from_single_file fetches that VAE's
    config from Wan-AI/Wan2.1-T2V-14B-Diffusers (its single-file default for a Wan VAE): offline, the builder
    writes it into an HF cache (`hf-home/`) that the server gets as HF_HOME.
  - `wav2vec2-large-xlsr-53-english/`: transformers' `Wav2Vec2ForCTC` at wav2vec2-large-xlsr-53's sizes (24
    layers, 1024 wide, 16 heads, ffn 4096, 7 conv layers of 512, stable layer norm) with the English
    fine-tune's 33-letter CTC head, fp32 `model.safetensors`, its processor files.

`--tiny` (the CPU rehearsal): the same layouts with 2-layer transformers, a tiny UMT5 and wav2vec2, the Diffusers
VAE at the kit's tiny width; S2V's original-layout VAE stays full (its names are ComfyUI's full-size class).
"""
from __future__ import annotations

import base64
import json
import re
from pathlib import Path
from typing import Any

from .pipeline_families import FIXTURES, HERE, S2V_CONFIG_EXTRA, Pipeline
from .weights import TINY_UMT5, UMT5_SIZES, _tensors

TOKENIZER_FILES = ("special_tokens_map.json", "spiece.model", "tokenizer.json", "tokenizer_config.json")
# wav2vec2-large-xlsr-53 (facebook) sizes with the 33-token CTC head of the English fine-tune that Wan2.2-S2V
# ships as wav2vec2-large-xlsr-53-english/.
WAV2VEC2 = dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096,
                feat_extract_norm="layer", do_stable_layer_norm=True, conv_bias=True, feat_extract_activation="gelu",
                conv_dim=[512] * 7, conv_stride=[5, 2, 2, 2, 2, 2, 2], conv_kernel=[10, 3, 3, 3, 3, 2, 2],
                num_conv_pos_embeddings=128, num_conv_pos_embedding_groups=16, vocab_size=33, pad_token_id=0,
                architectures=["Wav2Vec2ForCTC"])
TINY_WAV2VEC2 = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                     conv_dim=[16] * 7, num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=2)
TINY_DIT = dict(num_attention_heads=2, attention_head_dim=16, ffn_dim=64, num_layers=2)
TINY_VACE = dict(TINY_DIT, vace_layers=[0])
# VACE-1.3B keeps its 30 layers of 12 heads (how the launcher tells it from the 14B) at a 4-wide head
TINY_VACE_1_3B = dict(attention_head_dim=4, ffn_dim=16)
TINY_S2V = dict(dim=64, num_heads=2, ffn_dim=64, num_layers=2, audio_inject_layers=[0, 1])
TINY_VAE = dict(base_dim=4)     # the kit's tiny Wan VAE width (decoder_base_dim follows it)
VAE_SINGLE_FILE_REPO = "Wan-AI/Wan2.1-T2V-14B-Diffusers"     # diffusers' single-file config for a Wan VAE
HF_REVISION = "0" * 40       # the cache's one snapshot (any 40-hex name; refs/main points at it)
VOCAB = ["<pad>", "<s>", "</s>", "<unk>", "|", *"ETAONIHSRDLUMWCFGYPBVK'XJQZ"]


def _b64(data: bytes) -> dict:
    return {"b64": base64.b64encode(data).decode()}


def _json_file(doc: dict) -> dict:
    return _b64((json.dumps(doc, indent=2) + "\n").encode())


def _fixture(p: Pipeline, rel: str) -> dict:
    return json.loads((FIXTURES / p.fixture / rel).read_text())


def _plain(cfg: dict) -> dict:
    return {k: v for k, v in cfg.items() if not k.startswith("_")}


def _meta(factory: Any, device: str = "meta") -> Any:
    import torch

    with torch.device(device):
        return factory()


def _umt5(tiny: bool, te_cfg: dict) -> tuple[Any, dict]:
    """UMT5-XXL (or the rehearsal's stand-in) as the repos save it: bf16, the tied embedding once."""
    from transformers import UMT5Config, UMT5EncoderModel

    cfg = {k: v for k, v in te_cfg.items() if k not in ("architectures", "transformers_version", "dtype",
                                                         "torch_dtype")}
    config = UMT5Config(**dict(cfg, **(TINY_UMT5 if tiny else UMT5_SIZES)))
    config.architectures = ["UMT5EncoderModel"]
    model = _meta(lambda: UMT5EncoderModel(config))
    return model, dict(config.to_dict(), dtype="bfloat16")


def diffusers_parts(p: Pipeline, tokenizer: Path, tiny: bool) -> dict:
    """model_index.json, scheduler, tokenizer (from the kit's folder: the same T5TokenizerFast files), and the
    transformer / text encoder / VAE tensors."""
    from diffusers import AutoencoderKLWan, WanTransformer3DModel, WanVACETransformer3DModel

    index = _fixture(p, "model_index.json")
    tr_cfg = dict(_fixture(p, "transformer/config.json"), **p.transformer)
    vae_cfg = _fixture(p, "vae/config.json")
    if tiny:
        tr_cfg.update({"vace_1_3b": TINY_VACE_1_3B, "vace_14b": TINY_VACE}.get(p.family, TINY_DIT),
                      text_dim=TINY_UMT5["d_model"])
        vae_cfg.update(TINY_VAE, decoder_base_dim=None)
    cls = WanVACETransformer3DModel if index["transformer"][1] == "WanVACETransformer3DModel" else WanTransformer3DModel
    transformer = _meta(lambda: cls(**_plain(tr_cfg)))
    vae = _meta(lambda: AutoencoderKLWan(**_plain(vae_cfg)))
    te, te_cfg = _umt5(tiny, _fixture(p, "text_encoder/config.json"))
    files = {"model_index.json": _json_file(index),
             "scheduler/scheduler_config.json": _json_file(_fixture(p, "scheduler/scheduler_config.json")),
             "transformer/config.json": _json_file(tr_cfg), "vae/config.json": _json_file(vae_cfg),
             "text_encoder/config.json": _json_file(te_cfg)}
    files.update({f"tokenizer/{n}": _b64((tokenizer / n).read_bytes()) for n in TOKENIZER_FILES})
    te_names = [k for k in te.state_dict() if k != "encoder.embed_tokens.weight"]   # tied: saved once
    return {"files": files, "parts": [
        {"name": "transformer", "path": "transformer/diffusion_pytorch_model", "format": "safetensors",
         "tensors": _tensors(transformer.state_dict(), dtype="bf16")},
        {"name": "text_encoder", "path": "text_encoder/model", "format": "safetensors", "shared": "umt5",
         "tensors": _tensors(te.state_dict(), te_names, "bf16")},
        {"name": "vae", "path": "vae/diffusion_pytorch_model", "format": "safetensors",
         "tensors": _tensors(vae.state_dict(), dtype="fp32")}]}


# vLLM-Omni's WanS2VTransformer3DModel name -> Wan's checkpoint name (the inverse of its load_weights).
S2V_BACK = ((r"\.self_attn\.to_out\.", ".self_attn.o."), (r"\.cross_attn\.to_([qkv])\.", r".cross_attn.\1."),
            (r"\.cross_attn\.to_out\.", ".cross_attn.o."), (r"\.ffn\.net_0\.proj\.", ".ffn.0."),
            (r"\.ffn\.net_2\.", ".ffn.2."), (r"^(audio_injector\.injector\.\d+)\.to_([qkv])\.", r"\1.\2."),
            (r"^(audio_injector\.injector\.\d+)\.to_out\.", r"\1.o."), (r"^proj_out\.", "head.head."),
            (r"^output_scale_shift_prepare\.scale_shift_table$", "head.modulation"),
            (r"^condition_embedder\.time_embedder\.linear_1\.", "time_embedding.0."),
            (r"^condition_embedder\.time_embedder\.linear_2\.", "time_embedding.2."),
            (r"^condition_embedder\.time_proj\.", "time_projection.1."),
            (r"^condition_embedder\.text_embedder\.linear_1\.", "text_embedding.0."),
            (r"^condition_embedder\.text_embedder\.linear_2\.", "text_embedding.2."))


def s2v_checkpoint_names(params: dict[str, list[int]]) -> list:
    """Wan's S2V checkpoint tensors from vLLM-Omni's parameter shapes (bf16)."""
    out = []
    for name, shape in params.items():
        m = re.match(r"^(blocks\.\d+\.self_attn)\.to_qkv\.(weight|bias)$", name)
        if m:
            out += [[f"{m.group(1)}.{x}.{m.group(2)}", [shape[0] // 3, *shape[1:]], "bf16"] for x in "qkv"]
            continue
        for pattern, repl in S2V_BACK:
            name = re.sub(pattern, repl, name)
        out.append([name, list(shape), "bf16"])
    return out


def vllm_omni_stand_ins(*modules: Any) -> None:
    """Let vLLM-Omni's transformer classes be built outside a server: one-rank tensor- and pipeline-parallel
    groups stand in for the server's (its layers ask for their size and stage), and attention (no parameters)
    for the platform's backend, which a CPU has none of, in each of `modules`."""
    import types

    import torch
    import vllm.distributed.parallel_state as ps
    import vllm.model_executor.custom_op as custom_op
    import vllm_omni.diffusion.distributed.parallel_state as omni_ps
    from vllm.config import CompilationConfig

    one = types.SimpleNamespace(world_size=1, rank_in_group=0, rank=0, local_rank=0, is_first_rank=True,
                                is_last_rank=True)
    ps._TP, ps._PP = ps._TP or one, ps._PP or one
    omni_ps._PP = omni_ps._PP or one     # the Wan transformer asks whether it is the first pipeline stage
    # vLLM's custom ops (the Wan transformer's Conv3d) ask for a compilation config: none of them enabled
    custom_op.get_cached_compilation_config = lambda: CompilationConfig(custom_ops=["none"])

    class NoAttention(torch.nn.Identity):
        attn_backend = types.SimpleNamespace(get_name=lambda: "TORCH_SDPA")     # what the Wan block asks of it

    for module in modules:
        module.Attention = NoAttention


def s2v_transformer(cfg: dict, device: str = "meta") -> Any:
    """vLLM-Omni's S2V transformer (on the meta device unless `device`)."""
    import vllm_omni.diffusion.models.wan2_2.wan2_2_s2v_transformer as s2v

    vllm_omni_stand_ins(s2v)
    return _meta(lambda: s2v.create_s2v_transformer_from_config(cfg), device)


def wan_t5_names(te: Any) -> list:
    """UMT5EncoderModel's tensors in Wan's T5 checkpoint names (bf16), checked with vLLM-Omni's converter."""
    from vllm_omni.diffusion.models.wan2_2.pipeline_wan2_2_s2v import _convert_wan_t5_state_dict

    sd = te.state_dict()
    back = {"token_embedding.weight": "shared.weight", "norm.weight": "encoder.final_layer_norm.weight"}
    for i in range(te.config.num_layers):
        d = f"encoder.block.{i}.layer"
        back.update({f"blocks.{i}.attn.{x}.weight": f"{d}.0.SelfAttention.{x}.weight" for x in "qkvo"})
        back.update({f"blocks.{i}.pos_embedding.embedding.weight":
                     f"{d}.0.SelfAttention.relative_attention_bias.weight",
                     f"blocks.{i}.norm1.weight": f"{d}.0.layer_norm.weight",
                     f"blocks.{i}.ffn.gate.0.weight": f"{d}.1.DenseReluDense.wi_0.weight",
                     f"blocks.{i}.ffn.fc1.weight": f"{d}.1.DenseReluDense.wi_1.weight",
                     f"blocks.{i}.ffn.fc2.weight": f"{d}.1.DenseReluDense.wo.weight",
                     f"blocks.{i}.norm2.weight": f"{d}.1.layer_norm.weight"})
    wan = {k: sd[v] for k, v in back.items()}
    if te.config.num_layers == 24:     # the converter walks its own 24-layer config
        hf = _convert_wan_t5_state_dict(wan)
        bad = [k for k in sd if k not in hf or tuple(hf[k].shape) != tuple(sd[k].shape)]
        if bad or len(hf) != len(sd):
            raise ValueError(f"Wan T5 names do not convert back to UMT5: {bad[:5]}")
    return [[k, list(v.shape), "bf16"] for k, v in wan.items()]


def wan_vae_names(tiny: bool) -> list:
    """Wan2.1's original VAE tensors (fp32), from ComfyUI's class as the A14B manifest holds them, checked
    through diffusers' single-file converter against AutoencoderKLWan's state dict."""
    import torch
    from diffusers import AutoencoderKLWan
    from diffusers.loaders.single_file_utils import convert_wan_vae_to_diffusers

    tensors = [[k, s, "fp32"] for k, s, _ in json.loads((HERE / "manifest_t2v_a14b.json").read_text())["comfy"]["vae"]]
    vae_cfg = json.loads((FIXTURES / "Wan-AI/Wan2.2-T2V-A14B-Diffusers/vae/config.json").read_text())
    want = _meta(lambda: AutoencoderKLWan(**_plain(vae_cfg))).state_dict()
    got = convert_wan_vae_to_diffusers({k: torch.empty(s, device="meta") for k, s, _ in tensors})
    bad = [k for k in want if k not in got or tuple(got[k].shape) != tuple(want[k].shape)]
    if bad or len(got) != len(want):
        raise ValueError(f"the original VAE names do not convert to AutoencoderKLWan: {bad[:5]}")
    return tensors


def s2v_parts(p: Pipeline, tokenizer: Path, tiny: bool) -> dict:
    from transformers import Wav2Vec2Config, Wav2Vec2ForCTC

    cfg = dict(_fixture(p, "config.json"), **S2V_CONFIG_EXTRA, **(TINY_S2V if tiny else {}))
    if tiny:
        cfg["text_dim"] = TINY_UMT5["d_model"]
    model = s2v_transformer(cfg)
    transformer = s2v_checkpoint_names({k: list(v.shape) for k, v in model.named_parameters()})
    te, _ = _umt5(tiny, {})
    w2v_cfg = Wav2Vec2Config(**dict(WAV2VEC2, **(TINY_WAV2VEC2 if tiny else {})))
    w2v = _meta(lambda: Wav2Vec2ForCTC(w2v_cfg))
    w2v_dir = "wav2vec2-large-xlsr-53-english"
    vae_cfg = json.loads((FIXTURES / "Wan-AI/Wan2.2-T2V-A14B-Diffusers/vae/config.json").read_text())
    cache = f"hf-home/hub/models--{VAE_SINGLE_FILE_REPO.replace('/', '--')}"
    files = {"config.json": _json_file(cfg),
             "configuration.json": _json_file({"framework": "Pytorch", "task": "speech-to-video"}),
             f"{w2v_dir}/config.json": _json_file(w2v_cfg.to_dict()),
             f"{w2v_dir}/preprocessor_config.json": _json_file(
                 {"do_normalize": True, "feature_extractor_type": "Wav2Vec2FeatureExtractor", "feature_size": 1,
                  "padding_side": "right", "padding_value": 0.0, "return_attention_mask": True,
                  "sampling_rate": 16000}),
             f"{w2v_dir}/vocab.json": _json_file({t: i for i, t in enumerate(VOCAB)}),
             f"{w2v_dir}/special_tokens_map.json": _json_file(
                 {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"})}
    files.update({f"google/umt5-xxl/{n}": _b64((tokenizer / n).read_bytes()) for n in TOKENIZER_FILES})
    outside = {f"{cache}/refs/main": _b64(HF_REVISION.encode()),
               f"{cache}/snapshots/{HF_REVISION}/vae/config.json": _json_file(vae_cfg)}
    return {"files": files, "outside": outside, "parts": [
        {"name": "transformer", "path": "diffusion_pytorch_model", "format": "safetensors", "shards": 4,
         "tensors": transformer},
        {"name": "text_encoder", "path": "models_t5_umt5-xxl-enc-bf16.pth", "format": "pth",
         "tensors": wan_t5_names(te)},
        {"name": "vae", "path": "Wan2.1_VAE.pth", "format": "pth", "tensors": wan_vae_names(tiny)},
        {"name": "audio_encoder", "path": f"{w2v_dir}/model", "format": "safetensors",
         "tensors": _tensors(w2v.state_dict(), dtype="fp32")}]}


def manifest(p: Pipeline, tokenizer: Path, tiny: bool = False) -> dict:
    """One pipeline's manifest: small files (base64; `outside`: beside the model folder) and its parts."""
    doc = (s2v_parts if p.layout == "s2v-original" else diffusers_parts)(p, tokenizer, tiny)
    return dict(doc, pipeline=p.name, layout=p.layout, tiny=tiny)


def write(p: Pipeline, tokenizer: Path, out: Path, tiny: bool = False) -> dict:
    doc = manifest(p, tokenizer, tiny)
    out.write_text(json.dumps(doc, separators=(",", ":")))
    return doc
