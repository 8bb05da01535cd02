"""What the stub's fake GPU knows about the served model, read from its (fake Hub) configs.

The Wan pipeline class decides the request checks (I2V needs an image, size multiples) and the
configs give a rough weight size for the ``Model loading took`` line.
"""
from __future__ import annotations

from dataclasses import dataclass

I2V_CLASSES = {"WanImageToVideoPipeline", "WanI2VDMD2Pipeline"}
WAN_CLASSES = {"WanPipeline", "WanDMDPipeline", "WanT2VDMD2Pipeline"} | I2V_CLASSES


@dataclass
class ModelFacts:
    class_name: str | None
    is_wan: bool
    is_i2v: bool
    is_dmd: bool
    spatial: int          # vae scale_factor_spatial
    temporal: int         # vae scale_factor_temporal
    patch: int            # transformer patch_size[1]
    transformers: tuple[str, ...]
    dit_bytes: int        # bf16 bytes of the DiT expert(s) the pipeline loads
    text_encoder_bytes: int
    vae_bytes: int
    num_shards: int

    def gpu_bytes(self, od_config, world_size: int) -> int:
        """Rough per-GPU weight footprint, for the ``Model loading took`` line."""
        pc = od_config.parallel_config
        dit = self.dit_bytes / max(1, int(getattr(pc, "tensor_parallel_size", 1) or 1))
        if getattr(pc, "use_hsdp", False):
            shard = int(getattr(pc, "hsdp_shard_size", -1) or -1)
            dit /= shard if shard > 0 else max(1, world_size)
        te = self.text_encoder_bytes
        if getattr(od_config, "enable_layerwise_offload", False):
            dit *= 0.05
        if getattr(od_config, "enable_cpu_offload", False):
            te = 0
        return int(dit + te + self.vae_bytes)

    @classmethod
    def load(cls, od_config) -> "ModelFacts":
        from vllm_omni.diffusion.utils.hf_utils import get_diffusion_model_index
        from vllm.transformers_utils.config import get_hf_file_to_dict

        model = od_config.model
        class_name = getattr(od_config, "model_class_name", None)

        def cfg(name: str) -> dict:
            try:
                return get_hf_file_to_dict(name, model) or {}
            except Exception:
                return {}

        index = get_diffusion_model_index(model) or {}
        vae = cfg("vae/config.json")
        dits = []
        for comp in ("transformer", "transformer_2"):
            entry = index.get(comp)
            if isinstance(entry, list) and entry and entry[0] is None:
                continue
            conf = cfg(f"{comp}/config.json")
            if conf:
                dits.append((comp, conf))
        boundary = getattr(od_config, "boundary_ratio", None)
        if boundary == 1.0:
            dits = [d for d in dits if d[0] == "transformer_2"] or dits
        elif boundary == 0.0:
            dits = [d for d in dits if d[0] == "transformer"] or dits
        patch = 2
        dit_bytes = te_bytes = 0
        for _, conf in dits:
            p = conf.get("patch_size") or [1, 2, 2]
            patch = int(p[1]) if isinstance(p, (list, tuple)) and len(p) > 1 else 2
            d = int(conf.get("num_attention_heads", 1)) * int(conf.get("attention_head_dim", 64))
            ffn = int(conf.get("ffn_dim", 4 * d))
            layers = int(conf.get("num_layers", 1))
            dit_bytes += 2 * layers * (8 * d * d + 2 * d * ffn) + 2 * d * int(conf.get("text_dim", d))
        te = cfg("text_encoder/config.json")
        if te:
            dm, ff = int(te.get("d_model", 0)), int(te.get("d_ff", 0))
            inner = int(te.get("num_heads", 1)) * int(te.get("d_kv", 64))
            te_bytes = 2 * (int(te.get("num_layers", 0)) * (4 * dm * inner + 3 * dm * ff)
                            + int(te.get("vocab_size", 0)) * dm)
        return cls(
            class_name=class_name,
            is_wan=class_name in WAN_CLASSES,
            is_i2v=class_name in I2V_CLASSES,
            is_dmd=index.get("_class_name") == "WanDMDPipeline",
            spatial=int(vae.get("scale_factor_spatial") or 8),
            temporal=int(vae.get("scale_factor_temporal") or 4),
            patch=patch,
            transformers=tuple(name for name, _ in dits),
            dit_bytes=dit_bytes,
            text_encoder_bytes=te_bytes,
            # Wan2.1 VAE (base_dim 96) has ~127 M parameters; scale with the width
            vae_bytes=int(2 * 127_000_000 * (int(vae.get("base_dim", 96)) / 96) ** 2) if vae else 0,
            num_shards=max(1, len(dits)),
        )
