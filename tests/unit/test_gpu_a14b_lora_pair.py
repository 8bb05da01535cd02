"""The T2V-A14B 4-step LoRA pair of the head-to-head (bench/gpu, variant `lightx2v_4step`): ComfyUI's template in
its enabled group (the lightx2v distill LoRAs) against our 4-step LoRA template, and the random LoRA file the
`weights` phase writes for both sides.

The file's keys are checked here against ComfyUI's LoRA key rules on the committed manifest (the names and shapes
of ComfyUI's own WanModel at full size) and against the layout tests/contract/lora_loader_check.py fuses through
vLLM-Omni 0.30's real loader; the CPU rehearsal (bench/gpu/rehearse.sh) runs ComfyUI's and diffusers' real code
on the tiny file and both graphs end to end.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
try:
    from bench.gpu import graphs, lora_weights, native, report, weights
    from bench.gpu.families import T2V_A14B
finally:
    sys.path.remove(str(REPO))      # the repo root holds top-level names (server, nodes) ComfyUI also uses

MANIFEST = json.loads(T2V_A14B.manifest.read_text())
REQUEST = {"prompt": "a fox", "negative": "blurry", "width": 832, "height": 480, "frames": 81, "fps": 16,
           "seed": 7, "steps": 4}
HIGH, LOW = T2V_A14B.loras


def test_the_native_lora_graph_patches_each_expert_between_its_unet_loader_and_its_model_sampling():
    g, image = native.variant_prompt("t2v-a14b", "native", "lightx2v_4step", REQUEST, "local/unused")
    assert image == [graphs.DECODE, 0]
    high, low = g[graphs.KSAMPLER]["inputs"], g[graphs.KSAMPLER_2]["inputs"]
    chains = []
    for stage in (high, low):
        sampling = g[stage["model"][0]]
        lora = g[sampling["inputs"]["model"][0]]
        unet = g[lora["inputs"]["model"][0]]
        assert (sampling["class_type"], lora["class_type"], unet["class_type"]) == (
            "ModelSamplingSD3", "LoraLoaderModelOnly", "UNETLoader")
        assert sampling["inputs"]["shift"] == 5.0 and lora["inputs"]["strength_model"] == 1.0
        chains.append((unet["inputs"]["unet_name"], lora["inputs"]["lora_name"]))
    assert chains == [(T2V_A14B.files["unet"][1], HIGH), (T2V_A14B.unet_aliases[0], LOW)]
    assert {high["cfg"], low["cfg"]} == {1.0} and {high["steps"], low["steps"]} == {4}
    assert (high["start_at_step"], high["end_at_step"], low["start_at_step"], low["end_at_step"]) == (0, 2, 2, 10000)
    assert high["add_noise"] == "enable" and low["add_noise"] == "disable" and low["latent_image"] == [graphs.KSAMPLER, 0]
    assert {high["sampler_name"], low["sampler_name"], high["scheduler"]} == {"euler", "simple"}
    # the plain 14B graph keeps its own recipe: no LoRA loader, shift 8, cfg 3.5
    plain, _ = native.variant_prompt("t2v-a14b", "native", "default", REQUEST, "local/unused")
    assert not any(e["class_type"] == "LoraLoaderModelOnly" for e in plain.values())
    assert plain["48"]["inputs"]["shift"] == 8.0 and plain[graphs.KSAMPLER]["inputs"]["cfg"] == 3.5


def test_our_lora_graph_fuses_one_lora_per_expert_with_guidance_1_and_shift_5_on_the_nodes_defaults():
    g, image = native.variant_prompt("t2v-a14b", "ours", "lightx2v_4step", REQUEST, "local/t2v-a14b-fullsize")
    loras = [e["inputs"] for e in g.values() if e["class_type"] == "VLLMOmniLora"]
    assert sorted((x["expert"], x["lora_name"], x["strength"]) for x in loras) == [
        ("high_noise", HIGH, 1), ("low_noise", LOW, 1)]
    gen = g[image[0]]
    assert gen["class_type"] == "VLLMOmniGenerateVideo"
    i = gen["inputs"]
    assert (i["guidance"], i["guidance_2"], i["flow_shift"], i["sampler"], i["steps"]) == (1.0, 1.0, 5.0, "euler", 4)
    assert (i["width"], i["height"], i["frames"], i["seed"]) == (832, 480, 81, 7)
    # the LoRA chain starts at Load Model (our model folder) and feeds Local Server
    server = g[i["server"][0]]
    chain, node = [], server["inputs"]["model"][0]
    while g[node]["class_type"] == "VLLMOmniLora":
        chain.append(g[node]["inputs"]["expert"])
        node = g[node]["inputs"]["model"][0]
    assert sorted(chain) == ["high_noise", "low_noise"]
    assert g[node]["inputs"]["model"] == "local/t2v-a14b-fullsize"
    # one GPU: the template's two-GPU Ulysses setting is replaced by the Serving Config node's defaults
    serving = g[server["inputs"]["serving"][0]]["inputs"]
    assert serving["gpus"] == "auto" and serving["parallel_mode"] == "auto"


def test_the_lora_variant_is_refused_for_a_family_without_its_loras():
    try:
        native.variant_prompt("ti2v-5b", "native", "lightx2v_4step", REQUEST, "local/unused")
    except ValueError as exc:
        assert "t2v-a14b" in str(exc) and "--family" in str(exc)
    else:
        raise AssertionError("the 5B graph took the 14B LoRA variant")


def test_both_sides_of_the_lora_pair_land_in_a_row_of_their_own():
    plain = SimpleNamespace(a=SimpleNamespace(comfy_arg=[]))
    fast = SimpleNamespace(a=SimpleNamespace(comfy_arg=["--fast"]))
    assert native.HeadToHead.pair(plain, "native", "lightx2v_4step", "first", 4) == "lora4 first 4 steps"
    assert native.HeadToHead.pair(plain, "ours", "lightx2v_4step", "lightx2v_4step-4", 4) == "lora4 warm 4 steps"
    assert native.HeadToHead.pair(fast, "native", "lightx2v_4step", "first", 4) == "lora4-fast first 4 steps"
    assert native.HeadToHead.pair(plain, "ours", "auto", "first", 4) == "default first 4 steps"
    rows = ["lora4 warm 4 steps", "fast first 20 steps", "default warm 20 steps", "lora4 first 4 steps",
            "default first 4 steps"]
    assert sorted(rows, key=report._pair_order) == [
        "default first 4 steps", "default warm 20 steps", "fast first 20 steps", "lora4 first 4 steps",
        "lora4 warm 4 steps"]


def test_every_lora_pair_patches_a_weight_of_comfyuis_key_map_with_its_shape():
    # comfy/lora.py model_lora_keys_unet: for each state-dict weight `diffusion_model.X.weight` the generic key
    # `diffusion_model.X`; weight_adapter/lora.py LoRAAdapter.load reads `X.lora_up.weight` [out, r] with
    # `X.lora_down.weight` [r, in], and load_lora the scalar `X.alpha`. The names and shapes are ComfyUI's own
    # WanModel's at full size (the committed manifest; ComfyUI prefixes them with `diffusion_model.`).
    key_map = {f"diffusion_model.{k.removesuffix('.weight')}": shape for k, shape, _ in MANIFEST["comfy"]["unet"]
               if k.endswith(".weight")}
    tensors = {k: shape for k, shape, _ in lora_weights.lora_tensors(MANIFEST["comfy"]["unet"])}
    modules = {k.rsplit(".", 2)[0] if k.endswith(".weight") else k.removesuffix(".alpha") for k in tensors}
    assert len(modules) == 40 * 10      # q, k, v, o of both attentions and the two FFN linears, 40 blocks
    for x in modules:
        out_features, in_features = key_map[x]
        assert tensors[f"{x}.lora_up.weight"] == [out_features, lora_weights.LORA_RANK]
        assert tensors[f"{x}.lora_down.weight"] == [lora_weights.LORA_RANK, in_features]
        assert tensors[f"{x}.alpha"] == []
    assert len(tensors) == 3 * len(modules)
    # rank 64 in fp32: the upstream file's 1.2 GB
    assert 1.2e9 < weights.nbytes(lora_weights.lora_tensors(MANIFEST["comfy"]["unet"])) < 1.25e9


def test_the_lora_file_has_the_layout_and_shapes_the_servers_fused_loader_check_uses():
    # tests/contract/lora_loader_check.py fuses make_tiny_lora's files through vLLM-Omni 0.30's real loader
    # (diffusers' Wan converter, every key applied); at full size ours names the same linears with the shapes
    # make_tiny_lora derives from our Diffusers transformer config: so the server reads the file ComfyUI reads.
    tiny = lora_weights.tiny_lora_module()
    per_block = tiny.comfy_lora_shapes(MANIFEST["diffusers"]["transformer"]["config"])
    layers = MANIFEST["diffusers"]["transformer"]["config"]["num_layers"]
    expected = {}
    for i in range(layers):
        for module, (out_features, in_features) in per_block.items():
            x = f"diffusion_model.blocks.{i}.{module}"
            expected.update({f"{x}.lora_down.weight": [64, in_features], f"{x}.lora_up.weight": [out_features, 64],
                             f"{x}.alpha": []})
    assert {k: s for k, s, _ in lora_weights.lora_tensors(MANIFEST["comfy"]["unet"])} == expected


def test_the_lora_is_filled_small_with_alpha_equal_to_its_rank():
    tensors = lora_weights.lora_tensors([["blocks.0.self_attn.q.weight", [128, 96], "f8"],
                                         ["blocks.0.self_attn.norm_q.weight", [128], "bf16"]])
    assert [k for k, _, _ in tensors] == ["diffusion_model.blocks.0.self_attn.q.lora_down.weight",
                                          "diffusion_model.blocks.0.self_attn.q.lora_up.weight",
                                          "diffusion_model.blocks.0.self_attn.q.alpha"]
    filler, shapes = weights.Filler(0), {k: s for k, s, _ in tensors}
    made = {k: filler.make(k, s, d, shapes) for k, s, d in tensors}
    assert made["diffusion_model.blocks.0.self_attn.q.alpha"].item() == 64.0
    down = made["diffusion_model.blocks.0.self_attn.q.lora_down.weight"]
    assert tuple(down.shape) == (64, 96) and 0.5e-3 < float(down.std()) < 2e-3


def test_the_disk_plan_counts_the_lora_once_on_disk(tmp_path: Path):
    plan = weights.disk_plan(MANIFEST, T2V_A14B, tmp_path / "base", tmp_path)
    assert 1.1 < plan["gib"]["loras"] < 1.2
    gib = plan["gib"]
    on_disk = sum(v for k, v in gib.items() if k not in T2V_A14B.shm)
    assert abs(plan["disk_bytes"] / (1 << 30) - on_disk) < 0.05
