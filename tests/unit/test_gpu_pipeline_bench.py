"""The issue-30 pipeline bench (bench/gpu/pipeline_*.py): what its one device session will build and queue.

A device session is expensive and runs once: the committed manifests (the random weights' names and shapes), the
folders they make (recognised as the pipeline they stand for), the graphs ComfyUI will run, the shapes and the
disk order are checked here, before it.
"""
from __future__ import annotations

import base64
import json
import math
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
try:
    from bench.gpu import pipeline_graphs, pipeline_weights
    from bench.gpu.pipeline_families import (DEVICE_ORDER, FIXTURES, PIPELINES, S2V_CONFIG_EXTRA, disk_order,
                                             latent_tokens)
    from bench.gpu.pipeline_manifest import s2v_checkpoint_names
finally:
    sys.path.remove(str(REPO))      # the repo root holds top-level names (server, nodes) ComfyUI also uses

from vllm_omni_launcher.models import PIPELINE_FAMILIES, check_request, family_for  # noqa: E402
from vllm_omni_launcher.planner.model_sizes import _UMT5_XXL  # noqa: E402

MANIFESTS = {name: json.loads(p.manifest.read_text()) for name, p in PIPELINES.items()}
# Wan-AI/Wan2.2-S2V-14B's files (the repo's file list at the revision a loader pins; the weights' shards are 4)
S2V_REPO_FILES = {
    "config.json", "configuration.json", "diffusion_pytorch_model.safetensors.index.json",
    *(f"diffusion_pytorch_model-0000{i}-of-00004.safetensors" for i in range(1, 5)),
    "models_t5_umt5-xxl-enc-bf16.pth", "Wan2.1_VAE.pth",
    *(f"google/umt5-xxl/{n}" for n in ("special_tokens_map.json", "spiece.model", "tokenizer.json",
                                       "tokenizer_config.json")),
    *(f"wav2vec2-large-xlsr-53-english/{n}" for n in ("config.json", "preprocessor_config.json",
                                                      "special_tokens_map.json", "vocab.json", "model.safetensors"))}


def params(part: dict) -> int:
    return sum(math.prod(shape) for _, shape, _ in part["tensors"])


def part(manifest: dict, name: str) -> dict:
    return next(p for p in manifest["parts"] if p["name"] == name)


def small_file(manifest: dict, rel: str) -> dict:
    return json.loads(base64.b64decode(manifest["files"][rel]["b64"]))


@pytest.mark.parametrize("name", sorted(PIPELINES))
def test_each_manifest_holds_the_parameters_the_planner_counts_for_its_family(name: str):
    m, fam = MANIFESTS[name], PIPELINE_FAMILIES[PIPELINES[name].family]
    assert m["pipeline"] == name and not m["tiny"]
    assert params(part(m, "transformer")) == pytest.approx(fam.dit_params_b * 1e9, rel=0.03)
    assert params(part(m, "text_encoder")) == pytest.approx(_UMT5_XXL, rel=0.01)


def test_the_diffusers_manifests_take_their_configs_from_the_real_repos_and_vace_14b_its_own_sizes():
    for name in ("vace-1.3b", "fastwan-ti2v-5b"):
        p, m = PIPELINES[name], MANIFESTS[name]
        for rel in ("model_index.json", "transformer/config.json", "vae/config.json"):
            assert small_file(m, rel) == json.loads((FIXTURES / p.fixture / rel).read_text()), (name, rel)
    vace = small_file(MANIFESTS["vace-14b"], "transformer/config.json")
    assert (vace["num_layers"], vace["num_attention_heads"], vace["ffn_dim"]) == (40, 40, 13824)
    assert vace["vace_layers"] == [0, 5, 10, 15, 20, 25, 30, 35] and vace["vace_in_channels"] == 96
    assert small_file(MANIFESTS["fastwan-ti2v-5b"], "model_index.json")["_class_name"] == "WanDMDPipeline"


def test_the_s2v_manifest_is_wans_original_layout_with_the_released_checkpoints_1260_tensors():
    m = MANIFESTS["s2v-14b"]
    names = [k for k, _, _ in part(m, "transformer")["tensors"]]
    assert len(names) == len(set(names)) == 1260 and part(m, "transformer")["shards"] == 4
    assert {"blocks.0.self_attn.q.weight", "blocks.39.ffn.2.bias", "head.modulation", "time_projection.1.weight",
            "casual_audio_encoder.weights", "frame_packer.proj_4x.weight"} <= set(names)
    assert not [n for n in names if "to_qkv" in n or ".to_" in n or "net_0" in n]
    files = set(m["files"]) | {"diffusion_pytorch_model.safetensors.index.json",
                               *(f"diffusion_pytorch_model-0000{i}-of-00004.safetensors" for i in range(1, 5))}
    files |= {item["path"] + ("" if item["format"] == "pth" else ".safetensors")
              for item in m["parts"] if item["name"] != "transformer"}
    assert files == S2V_REPO_FILES
    config = small_file(m, "config.json")
    assert {k: config[k] for k in S2V_CONFIG_EXTRA} == S2V_CONFIG_EXTRA and config["model_type"] == "s2v"
    t5 = {k: s for k, s, _ in part(m, "text_encoder")["tensors"]}
    assert t5["token_embedding.weight"] == [256384, 4096] and t5["blocks.23.ffn.gate.0.weight"] == [10240, 4096]
    assert params(part(m, "audio_encoder")) == pytest.approx(315e6, rel=0.01)   # wav2vec2-large-xlsr-53 + CTC head


def test_s2v_names_are_vllm_omnis_parameters_mapped_back_with_the_fused_qkv_split_in_three():
    got = s2v_checkpoint_names({"blocks.3.self_attn.to_qkv.weight": [30, 10], "blocks.3.self_attn.to_out.bias": [10],
                                "blocks.3.cross_attn.to_k.weight": [10, 10], "blocks.3.ffn.net_0.proj.weight": [40, 10],
                                "audio_injector.injector.1.to_out.weight": [10, 10], "proj_out.bias": [4],
                                "output_scale_shift_prepare.scale_shift_table": [1, 2, 10],
                                "condition_embedder.time_embedder.linear_2.weight": [10, 10]})
    assert got == [["blocks.3.self_attn.q.weight", [10, 10], "bf16"], ["blocks.3.self_attn.k.weight", [10, 10], "bf16"],
                   ["blocks.3.self_attn.v.weight", [10, 10], "bf16"], ["blocks.3.self_attn.o.bias", [10], "bf16"],
                   ["blocks.3.cross_attn.k.weight", [10, 10], "bf16"], ["blocks.3.ffn.0.weight", [40, 10], "bf16"],
                   ["audio_injector.injector.1.o.weight", [10, 10], "bf16"], ["head.head.bias", [4], "bf16"],
                   ["head.modulation", [1, 2, 10], "bf16"], ["time_embedding.2.weight", [10, 10], "bf16"]]


@pytest.mark.parametrize("name", sorted(PIPELINES))
def test_a_built_folder_is_recognised_by_the_launcher_as_the_pipeline_it_stands_for(name: str, tmp_path: Path):
    m, p = MANIFESTS[name], PIPELINES[name]
    folder = tmp_path / p.folder
    for rel, spec in m["files"].items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(base64.b64decode(spec["b64"]))
    for item in m["parts"]:     # the weight files' names (their contents are not read to recognise a folder)
        path = folder / (item["path"] if item["format"] == "pth" else item["path"] + ".safetensors")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
    assert family_for(str(folder)) is PIPELINE_FAMILIES[p.family]


@pytest.mark.parametrize("name", sorted(PIPELINES))
def test_both_shapes_pass_the_launchers_rules_and_the_held_out_one_has_more_tokens(name: str):
    p = PIPELINES[name]
    fam = PIPELINE_FAMILIES[p.family]
    for w, h, f in (p.shape, p.held_out):
        check_request(fam, width=w, height=h, frames=f, has_image=fam.pipeline == "s2v")
    assert latent_tokens(p, p.held_out) > latent_tokens(p, p.shape)
    if fam.pipeline == "s2v":      # one clip for the bench's 3 s of audio (16 fps): frames per clip >= 48
        assert min(p.shape[2], p.held_out[2]) >= 48


def test_the_vace_graph_sets_its_shape_through_the_templates_own_trim_and_scale_nodes():
    p = PIPELINES["vace-14b"]
    g = pipeline_graphs.pipeline_prompt(p, (1280, 720, 49), steps=4, seed=40, take=3, prefix="bench/x")
    gen = g[pipeline_graphs.job_node(g)]["inputs"]
    assert g[pipeline_graphs.node_of(g, "VLLMOmniLoadPipelineModel")]["inputs"]["model"] == "local/vace-14b-fullsize"
    assert (gen["width"], gen["height"], gen["frames"], gen["steps"], gen["seed"]) == (0, 0, 0, 4, 43)
    assert gen["prompt"].endswith(", take 3")
    trim = pipeline_graphs.node_of(pipeline_graphs.template(p.template), "ImageFromBatch")     # (+ the PNG sample's)
    assert g[trim]["inputs"]["length"] == 49
    assert {k: g[pipeline_graphs.node_of(g, "ImageScale")]["inputs"][k] for k in ("width", "height")} == \
        {"width": 1280, "height": 720}
    assert not [e for e in g.values() if e["class_type"] == "SaveVideo"]
    assert g["90"]["inputs"]["image"] == [pipeline_graphs.job_node(g), 0]


def test_the_s2v_and_fastwan_graphs_set_the_job_node_and_fastwan_keeps_its_own_steps():
    s2v = pipeline_graphs.pipeline_prompt(PIPELINES["s2v-14b"], (1024, 576, 48), 4, 40, 1, "bench/s")
    gen = s2v[pipeline_graphs.job_node(s2v)]["inputs"]
    assert (gen["width"], gen["height"], gen["frames"], gen["steps"]) == (1024, 576, 48, 4)
    assert s2v["94"]["inputs"]["length"] == 4 and pipeline_graphs.expected_frames(PIPELINES["s2v-14b"], 48) == 45
    fast = pipeline_graphs.pipeline_prompt(PIPELINES["fastwan-ti2v-5b"], (1536, 864, 97), 4, 40, 2, "bench/f")
    gen = fast[pipeline_graphs.job_node(fast)]["inputs"]
    assert (gen["width"], gen["height"], gen["frames"], gen["steps"]) == (1536, 864, 97, 0)


def test_the_device_order_keeps_each_group_of_pipelines_within_the_disk_the_kit_leaves():
    footprints = {name: pipeline_weights.footprint_gib(MANIFESTS[name]) for group in DEVICE_ORDER for name in group}
    assert disk_order(footprints, free_gib=47.0) == [list(g) for g in DEVICE_ORDER]
    with pytest.raises(ValueError, match="does not fit"):
        disk_order({"s2v-14b": footprints["s2v-14b"]}, free_gib=40.0)


def test_weights_that_do_not_fit_are_refused_before_anything_is_written(tmp_path: Path):
    p = PIPELINES["vace-14b"]
    with pytest.raises(SystemExit, match="not enough room"):
        pipeline_weights.build(MANIFESTS["vace-14b"], tmp_path / "base", p, reserve=10 ** 15)
    assert not pipeline_weights.model_dir(tmp_path / "base", p).exists()
