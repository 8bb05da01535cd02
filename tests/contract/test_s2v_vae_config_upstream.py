"""The launcher's offline rule for S2V's VAE config agrees with the REAL loader (vLLM-Omni 0.30, diffusers 0.40).

The call pipeline_wan2_2_s2v.py makes for the original layout runs offline against two HF caches
(wan_vae_config_probe.py, in the session's resolver process): an empty one, where upstream stops with the line
the launcher refuses on and classifies, and one holding only `Wan-AI/Wan2.1-T2V-14B-Diffusers` `vae/config.json`
laid out as huggingface_hub writes it, where upstream gets past the config to the weights (the probe's
checkpoint holds one tensor), and the launcher lets the launch go.
"""
from __future__ import annotations

import json

from fake_hf_cache import cache_file
from vllm_omni_launcher.errors import failure_patterns as patterns
from vllm_omni_launcher.models import PIPELINE_FAMILIES
from vllm_omni_launcher.server.launch import hf_cache

S2V = PIPELINE_FAMILIES["s2v_14b"]
VAE_CONFIG = {"_class_name": "AutoencoderKLWan", "base_dim": 96, "z_dim": 16, "dim_mult": [1, 2, 4, 4],
              "num_res_blocks": 2, "attn_scales": [], "temperal_downsample": [False, True, True], "dropout": 0.0}


def test_the_launchers_cache_rule_matches_the_real_s2v_vae_load(upstream_resolver, tmp_path):
    empty, cached = tmp_path / "empty" / "hub", tmp_path / "cached" / "hub"
    empty.mkdir(parents=True)
    cache_file(cached, patterns.WAN_VAE_CONFIG_REPO, patterns.WAN_VAE_CONFIG_FILE, json.dumps(VAE_CONFIG).encode())
    [said] = upstream_resolver.resolve([{"call": "wan_vae_config_probe:check",
                                         "input": {"pth": str(tmp_path / "Wan2.1_VAE.pth"),
                                                   "caches": [str(empty), str(cached)]}}], timeout=300)
    assert "call_error" not in said, said.get("call_error")
    assert said[str(empty)] == patterns.WAN_VAE_CONFIG_LINE
    assert patterns.WAN_VAE_CONFIG_MISSING.search(said[str(empty)])
    assert not patterns.WAN_VAE_CONFIG_MISSING.search(said[str(cached)]) and "config" not in said[str(cached)]
    offline = {"HF_HUB_OFFLINE": "1"}
    assert hf_cache.wan_vae_config_refusal(S2V.hf_id, S2V, {**offline, "HF_HUB_CACHE": str(empty)}) is not None
    assert hf_cache.wan_vae_config_refusal(S2V.hf_id, S2V, {**offline, "HF_HUB_CACHE": str(cached)}) is None
