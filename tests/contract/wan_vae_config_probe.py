"""The REAL S2V VAE load (vLLM-Omni 0.30 + diffusers 0.40) offline, against given HF caches (server side).

:func:`check` runs inside ``upstream_resolve.py`` (server python), called by name for a case
``{"call": "wan_vae_config_probe:check", "input": {"pth": FILE, "caches": [DIR, ...]}}``. For each cache it
makes the exact call pipeline_wan2_2_s2v.py makes for the original layout,
``DistributedAutoencoderKLWan.from_single_file(<Wan2.1_VAE.pth>, torch_dtype=torch.bfloat16)``, with
huggingface_hub in offline mode and that folder as its cache (the two module constants huggingface_hub reads
at call time, put back afterwards so the resolver's later cases run as before), and returns the last line of
what it raised, or "" when it loaded. ``pth`` holds only the tensor by which diffusers recognises a Wan VAE
(at its real shape), so a load that gets past the config goes on to the weights and ends there.
"""
from __future__ import annotations

from typing import Any


def check(inp: dict[str, Any]) -> dict[str, str]:
    import torch
    from huggingface_hub import constants
    from vllm_omni.diffusion.distributed.autoencoders.autoencoder_kl_wan import DistributedAutoencoderKLWan

    torch.save({"decoder.middle.0.residual.0.gamma": torch.zeros(384, 1, 1, 1)}, inp["pth"])
    saved = constants.HF_HUB_CACHE, constants.HF_HUB_OFFLINE
    said: dict[str, str] = {}
    try:
        for cache in inp["caches"]:
            constants.HF_HUB_CACHE, constants.HF_HUB_OFFLINE = cache, True
            try:
                DistributedAutoencoderKLWan.from_single_file(inp["pth"], torch_dtype=torch.bfloat16)
                said[cache] = ""
            except Exception as exc:  # noqa: BLE001 - what upstream raised is the answer
                said[cache] = f"{type(exc).__name__}: {exc}".strip().splitlines()[-1]
    finally:
        constants.HF_HUB_CACHE, constants.HF_HUB_OFFLINE = saved
    return said
