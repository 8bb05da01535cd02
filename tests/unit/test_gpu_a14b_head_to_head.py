"""The T2V-A14B head-to-head bench (bench/gpu): ComfyUI's 14B template graph and the weights' disk plan.

A device call is expensive and runs once: what can be checked before it (the graph ComfyUI will run, the
refusal to write weights that would not fit) is checked here.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
try:
    from bench.gpu import graphs, weights
    from bench.gpu.families import T2V_A14B
finally:
    sys.path.remove(str(REPO))      # the repo root holds top-level names (server, nodes) ComfyUI also uses

REQUEST = {"prompt": "a fox", "negative": "blurry", "width": 832, "height": 480, "frames": 81, "seed": 7,
           "steps": 20}


def test_the_native_14b_graph_runs_the_high_noise_expert_for_the_first_half_then_the_low_noise_one():
    g = graphs.native_prompt_a14b(REQUEST)
    high, low = g[graphs.KSAMPLER]["inputs"], g[graphs.KSAMPLER_2]["inputs"]
    assert (high["start_at_step"], high["end_at_step"], low["start_at_step"]) == (0, 10, 10)
    assert high["add_noise"] == "enable" and high["return_with_leftover_noise"] == "enable"
    assert low["add_noise"] == "disable" and low["latent_image"] == [graphs.KSAMPLER, 0]
    assert {high["cfg"], low["cfg"]} == {3.5} and {high["sampler_name"], low["sampler_name"]} == {"euler"}
    # each expert through its own ModelSamplingSD3 (shift 8) from its own UNETLoader file name
    loaders = {g[g[s["model"][0]]["inputs"]["model"][0]]["inputs"]["unet_name"] for s in (high, low)}
    assert len(loaders) == 2 and all("fp8_scaled" in name for name in loaders)
    assert g[graphs.DECODE]["inputs"]["samples"] == [graphs.KSAMPLER_2, 0]
    assert g["55"]["inputs"] == {"width": 832, "height": 480, "length": 81, "batch_size": 1}
    four = graphs.native_prompt_a14b(dict(REQUEST, steps=4))
    assert four[graphs.KSAMPLER]["inputs"]["end_at_step"] == 2 == four[graphs.KSAMPLER_2]["inputs"]["start_at_step"]


def test_the_14b_graph_refuses_easycache_which_has_one_sampler_to_patch():
    with pytest.raises(ValueError, match="two"):
        graphs.native_prompt_a14b(REQUEST, easycache=graphs.EASYCACHE)


def test_weights_that_do_not_fit_are_refused_before_anything_is_written(tmp_path: Path):
    manifest = json.loads(T2V_A14B.manifest.read_text())
    plan = weights.disk_plan(manifest, T2V_A14B, tmp_path / "base", tmp_path, reserve=10 ** 15)
    assert plan["short"] and "kept for the kit and venvs" in plan["short"][0]
    # the 14B transformer is counted once (transformer_2 is hard links), the ComfyUI fp8 file in shm
    assert 26 < plan["gib"]["transformer"] < 27.5 and 13 < plan["gib"]["unet"] < 14
    with pytest.raises(SystemExit, match="not enough room, nothing written"):
        weights.build(manifest, tmp_path / "base", fam=T2V_A14B, shm=tmp_path, reserve=10 ** 15, log=lambda s: None)
    assert not (tmp_path / "base" / "models").exists()
