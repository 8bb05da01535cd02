"""The model families of the head-to-head (`--family`): sizes, file names and placement of both sides.

TI2V-5B (the default, what the first device run used) and T2V-A14B (issue 26's 832x480x81 comparison). One
record per family, read by weights.py (manifest, build, detect) and native.py (the two graphs).

T2V-A14B, ComfyUI side: what ComfyUI's own "Wan2.2 14B text to video" template (comfyui-workflow-templates
0.1.95, video_wan2_2_14B_t2v.json) loads: `wan2.2_t2v_{high,low}_noise_14B_fp8_scaled.safetensors`
(UNETLoader, weight_dtype default), `umt5_xxl_fp8_e4m3fn_scaled.safetensors` (CLIPLoader type wan),
`wan_2.1_vae.safetensors`. The diffusion files are "scaled fp8" as ComfyUI writes them
(comfy/model_base.py state_dict_for_saving): every `operations.Linear` weight float8_e4m3fn with float32
per-tensor `scale_weight` and `scale_input`, biases and the rest bf16, and a `scaled_fp8` marker tensor; the
manifest reads them off ComfyUI's WanModel built with `comfy.ops.scaled_fp8_ops`, so detection and the
scaled-fp8 path see the layout a user's file has (13.3 GiB, as Comfy-Org's 14B files). The marker's element
count picks ComfyUI's matmul (model_detection: 2 elements = cast each weight to the compute dtype, anything
else = fp8 `_scaled_mm` where the card has fp8 compute, as H100/H200 do): ComfyUI's own save writes an empty
marker, and a user who read Comfy-Org's Wan2.2 14B fp8_scaled file reports its marker empty, so the default
is 0 elements (`weights --fp8-marker-elements 2`: the cast path). `detect` records which path ComfyUI takes.
The high- and low-noise files are one file under two names (hard links): random weights, speed only.
The template's text encoder is an fp8_scaled UMT5; both sides here read one bf16 UMT5 file instead (the
same weights on both sides, 10.6 GiB once): the encoder runs once per prompt (two 512-token passes, well
under a second on either side) against 4-20 steps of several seconds each at 832x480x81, so its dtype does
not move the comparison; ComfyUI's peak while encoding is the bf16 encoder's, not the fp8 one's.
The template's enabled group adds the lightx2v 4-step distill LoRAs (LoraLoaderModelOnly per expert), under
the file names Comfy-Org repackaged them as (`loras`): one random file under both names (weights.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
GIB = 1 << 30
# Wan2.2 sizes shared by both families' ComfyUI side (model_detection derives the rest from the file).
_COMFY_WAN = dict(model_type="t2v", patch_size=(1, 2, 2), text_len=512, freq_dim=256, text_dim=4096,
                  window_size=(-1, -1), qk_norm=True, cross_attn_norm=True, eps=1e-6, image_model="wan2.1")
_DIFFUSERS_WAN = dict(patch_size=(1, 2, 2), text_dim=4096, freq_dim=256, cross_attn_norm=True,
                      qk_norm="rms_norm_across_heads", eps=1e-6, image_dim=None, added_kv_proj_dim=None,
                      rope_max_seq_len=1024, pos_embed_seq_len=None)
_VAE_LAYOUT = dict(dim_mult=[1, 2, 4, 4], num_res_blocks=2, attn_scales=[], temperal_downsample=[False, True, True],
                   dropout=0.0)
UMT5_FILE = ("text_encoders", "umt5_xxl_random_bf16.safetensors")


@dataclass(frozen=True)
class Family:
    """One model family: how each side's files are shaped, named and placed."""

    name: str
    manifest: Path
    kit_folder: str                     # the tiny kit folder the Diffusers configs and small files come from
    diffusers_folder: str               # under <base>/models/diffusers
    transformer: dict                   # diffusers WanTransformer3DModel config at full size
    vae_full: dict                      # AutoencoderKLWan config updates at full size
    comfy_unet: dict                    # comfy.ldm.wan.model.WanModel kwargs (model_detection's derivation)
    comfy_unet_tiny: dict
    comfy_vae: tuple[str, dict]         # (comfy.ldm.wan module, WanVAE kwargs) as comfy.sd.VAE builds it
    files: dict[str, tuple[str, str]]   # unet / te / vae: (models subfolder, file name)
    unet_aliases: tuple[str, ...] = ()  # more names of the one diffusion file (A14B: the low-noise expert)
    scaled_fp8: bool = False            # ComfyUI diffusion file as scaled fp8 (else bf16)
    experts: int = 1                    # 2: transformer_2/ hard-links transformer/ (one copy on disk)
    detect_class: str = ""              # the supported_models class ComfyUI must pick
    latent_channels: int = 16
    shm: tuple[str, ...] = ()           # ComfyUI files written to /dev/shm (linked into models/)
    loras: tuple[str, ...] = ()         # distill LoRA names in models/loras (A14B: high-, low-noise): one file

    def comfy_path(self, models: Path, key: str, name: str = "") -> Path:
        sub, default = self.files[key]
        return models / sub / (name or default)


TI2V_5B = Family(
    name="ti2v-5b", manifest=HERE / "manifest_ti2v5b.json", kit_folder="tiny-wan22-ti2v",
    diffusers_folder="ti2v-5b-fullsize",
    transformer=dict(_DIFFUSERS_WAN, num_attention_heads=24, attention_head_dim=128, in_channels=48,
                     out_channels=48, ffn_dim=14336, num_layers=30),
    vae_full=dict(base_dim=160, decoder_base_dim=256),
    comfy_unet=dict(_COMFY_WAN, in_dim=48, dim=3072, ffn_dim=14336, out_dim=48, num_heads=24, num_layers=30),
    comfy_unet_tiny=dict(_COMFY_WAN, in_dim=48, dim=128, ffn_dim=256, out_dim=48, num_heads=1, num_layers=2),
    comfy_vae=("vae2_2", dict(_VAE_LAYOUT, dim=160, z_dim=48)),
    files={"unet": ("diffusion_models", "wan2.2_ti2v_5B_random_bf16.safetensors"), "te": UMT5_FILE,
           "vae": ("vae", "wan2.2_vae_random.safetensors")},
    detect_class="WAN22_T2V", latent_channels=48)

# Wan-AI/Wan2.2-T2V-A14B-Diffusers: two 14.29 B experts (40 layers, 40 x 128 heads, ffn 13824, 16 latent
# channels), the Wan2.1 VAE (base_dim 96, z_dim 16), boundary_ratio 0.875 (model_index.json of the kit folder).
T2V_A14B = Family(
    name="t2v-a14b", manifest=HERE / "manifest_t2v_a14b.json", kit_folder="tiny-wan22-t2v-a14b",
    diffusers_folder="t2v-a14b-fullsize",
    transformer=dict(_DIFFUSERS_WAN, num_attention_heads=40, attention_head_dim=128, in_channels=16,
                     out_channels=16, ffn_dim=13824, num_layers=40),
    vae_full=dict(base_dim=96),
    comfy_unet=dict(_COMFY_WAN, in_dim=16, dim=5120, ffn_dim=13824, out_dim=16, num_heads=40, num_layers=40),
    comfy_unet_tiny=dict(_COMFY_WAN, in_dim=16, dim=128, ffn_dim=256, out_dim=16, num_heads=1, num_layers=2),
    comfy_vae=("vae", dict(_VAE_LAYOUT, dim=96, z_dim=16)),
    files={"unet": ("diffusion_models", "wan2.2_t2v_high_noise_14B_fp8_scaled.safetensors"), "te": UMT5_FILE,
           "vae": ("vae", "wan_2.1_vae.safetensors")},
    unet_aliases=("wan2.2_t2v_low_noise_14B_fp8_scaled.safetensors",), scaled_fp8=True, experts=2,
    detect_class="WAN21_T2V", latent_channels=16, shm=("unet",),
    loras=("wan2.2_t2v_lightx2v_4steps_lora_v1.1_high_noise.safetensors",
           "wan2.2_t2v_lightx2v_4steps_lora_v1.1_low_noise.safetensors"))

FAMILIES = {f.name: f for f in (TI2V_5B, T2V_A14B)}


def family(name: str) -> Family:
    return FAMILIES[name]


# Disk plan (what `weights` checks before writing): bytes per place, from the manifest.
SHM = Path("/dev/shm")
MARGIN = 1 * GIB        # left free on each filesystem after the weights


def placement(fam: Family, sizes: dict[str, int]) -> dict[str, Any]:
    """Bytes each filesystem receives: `sizes` per part ("unet", "te", "vae", "transformer", "diffusers_vae",
    A14B "loras"); hard links and aliases count once."""
    shm = sum(sizes[k] for k in fam.shm)
    disk = sum(v for k, v in sizes.items() if k not in fam.shm)
    return {"disk_bytes": disk, "shm_bytes": shm}
