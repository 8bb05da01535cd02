"""What the ladder recommends for two (or three) GPUs: no per-layer exchange without P2P while something else
fits, the most frames when the request must shrink, one-GPU rungs on the roomiest GPU, VAE patch parallel
only where its tiled decode pays, tensor parallel only at a degree that splits the model, and host RAM named
when it is the limit."""
from __future__ import annotations

from dataclasses import replace

import pytest

from vllm_omni_launcher.planner.gpus import hypothetical_gpus
from vllm_omni_launcher.planner.ladder import build_ladder, recommend
from vllm_omni_launcher.planner.memory import RequestShape
from vllm_omni_launcher.planner.peer_links import exchanges_every_layer
from vllm_omni_launcher.planner.speed_costs import speed_cost
from vllm_omni_launcher.server.launch.spec import LaunchSpec, ParallelConfig

T2V = "Wan-AI/Wan2.2-T2V-A14B-Diffusers"
TI2V = "Wan-AI/Wan2.2-TI2V-5B-Diffusers"
VACE_1_3B = "Wan-AI/Wan2.1-VACE-1.3B-diffusers"
FASTWAN = "FastVideo/FastWan2.2-TI2V-5B-FullAttn-Diffusers"
RTX_4090 = "NVIDIA GeForce RTX 4090"


def test_without_p2p_one_gpu_wins_over_a_parallel_mode_that_exchanges_every_layer():
    gpus = hypothetical_gpus([24.0, 24.0], name=RTX_4090)
    rec = recommend(T2V, RequestShape(832, 480, 81), gpus, p2p=False, host_available_gib=256.0)
    assert rec.spec.parallel.world_size == 1 and rec.spec.memory.offload == "layerwise", rec.text()
    assert not any("exchanges activations in every layer" in w for w in rec.warnings)
    assert not any(exchanges_every_layer(r.spec) for r in rec.rejected)   # never tried before it


def test_without_p2p_a_per_layer_mode_is_the_last_resort():
    """TI2V-5B on 24,24 with no host RAM to offload to: one GPU and CFG parallel need more than 24 GB, only
    tensor parallel (the DiT split) fits, so it is recommended, with the warning."""
    gpus = hypothetical_gpus([24.0, 24.0], name=RTX_4090)
    rec = recommend(TI2V, RequestShape(832, 480, 81), gpus, p2p=False, host_available_gib=1.0)
    assert rec.spec.parallel.mode == "tensor", rec.text()
    assert any("without peer-to-peer access" in w for w in rec.warnings)
    assert rec.rejected and all(not r.fits for r in rec.rejected)
    assert any(r.spec.parallel.world_size == 1 for r in rec.rejected)   # one GPU was tried first


def test_with_p2p_unknown_the_ranking_stays_and_the_plan_says_p2p_is_unknown():
    gpus = hypothetical_gpus([24.0, 24.0], name=RTX_4090)
    rec = recommend(T2V, RequestShape(832, 480, 81), gpus, p2p=None, host_available_gib=256.0)
    assert rec.spec.parallel.mode == "tensor" and rec.spec.memory.offload == "module", rec.text()
    assert any("is unknown" in w and "doctor" in w and "--p2p no" in w for w in rec.warnings)
    assert any("is unknown" in n for n in rec.notes)


def test_a_shrunk_request_gets_the_most_frames_any_configuration_fits():
    req = RequestShape(1280, 704, 121)
    two = recommend(VACE_1_3B, req, [16.0, 16.0], host_available_gib=256.0)
    one = recommend(VACE_1_3B, req, [16.0], host_available_gib=256.0)
    assert two.reduced and one.reduced
    assert two.request.frames >= one.request.frames == 117, (two.text(), one.text())
    assert "the most frames" in two.reason


def test_one_gpu_rungs_run_on_the_roomiest_gpu_whatever_its_place():
    req = RequestShape(1280, 704, 121)
    small_first = recommend(T2V, req, [24.0, 141.0], host_available_gib=256.0)
    big_first = recommend(T2V, req, [141.0, 24.0], host_available_gib=256.0)
    assert not small_first.reduced and not big_first.reduced
    assert small_first.spec.gpus == (1,) and big_first.spec.gpus == (0,)
    assert small_first.max_frames == big_first.max_frames
    assert "CUDA_VISIBLE_DEVICES=1 vllm serve" in small_first.text()


@pytest.mark.parametrize("model, req, mode", [
    (FASTWAN, RequestShape(1280, 704, 121), "ulysses"),   # 3 steps: the decode is most of the job
    (T2V, RequestShape(832, 480, 81), "cfg"),
])
def test_vae_patch_parallel_is_used_only_where_the_costs_favour_it(model, req, mode):
    rec = recommend(model, req, [80.0, 80.0], host_available_gib=256.0)
    assert rec.spec.parallel.mode == mode and rec.spec.parallel.vae_patch == 1, rec.text()
    patched = replace(rec.spec, parallel=ParallelConfig(mode, 2, 2))
    assert speed_cost(rec.spec, req.cfg, req) < speed_cost(patched, req.cfg, req)
    labels = [r.label for r in build_ladder(LaunchSpec(model), hypothetical_gpus([80.0, 80.0]), req)[0]]
    assert any(lbl.endswith("+ VAE patch 2") for lbl in labels)
    assert any(lbl.endswith("+ untiled VAE decode") for lbl in labels)


def test_a_step_distilled_model_gets_no_cfg_parallel():
    """FastWan's server forces guidance 1 (no negative branch): CFG parallel would leave a GPU idle."""
    rungs, _ = build_ladder(LaunchSpec(FASTWAN), hypothetical_gpus([80.0, 80.0]), RequestShape(1280, 704, 121))
    assert not any(r.spec.parallel.mode == "cfg" for r in rungs)


def test_three_gpus_get_no_tensor_parallel_that_cannot_split_the_heads():
    rungs, _ = build_ladder(LaunchSpec(T2V), hypothetical_gpus([24.0, 24.0, 24.0]), RequestShape(832, 480, 81))
    assert not any(r.spec.parallel.mode == "tensor" for r in rungs)
    rec = recommend(T2V, RequestShape(832, 480, 81), [24.0, 24.0, 24.0], host_available_gib=256.0)
    assert "tensor" not in rec.text()
    uly3 = next(r for r in rungs if r.spec.parallel.mode == "ulysses")
    assert "measured at 2 GPUs only, counted as 2-way at 3" in uly3.speed
    three, two = (LaunchSpec(T2V, gpus=tuple(range(d)),
                             parallel=ParallelConfig("ulysses", d, ulysses_mode="advanced_uaa")) for d in (3, 2))
    assert speed_cost(three) == speed_cost(two)                # no gain invented for the third GPU


def test_host_ram_alone_is_named_with_its_figures_and_the_flag():
    rec = recommend(T2V, RequestShape(832, 480, 81), [24.0], host_available_gib=20.0)
    assert rec.spec is None
    assert "host RAM is the limit" in rec.reason and "20 GiB is available" in rec.reason
    assert "--host-ram GB" in rec.reason and "free host RAM" in rec.reason
    weights = recommend(T2V, RequestShape(832, 480, 81), [8.0], host_available_gib=256.0)
    assert weights.spec is None and "host RAM" not in weights.reason and "weights are the limit" in weights.reason
