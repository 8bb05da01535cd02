"""planner.ladder: the done-when recommendations, the ladder order, and step_down for the supervisor."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest

from fake_nvml import broken_nvml
from vllm_omni_launcher.errors import LauncherError
from vllm_omni_launcher.planner.gpus import GpuInfo, hypothetical_gpus
from vllm_omni_launcher.planner.ladder import build_ladder, recommend
from vllm_omni_launcher.planner.memory import RequestShape, plan
from vllm_omni_launcher.planner.speed_costs import speed_cost
from vllm_omni_launcher.planner.step_down import FAILURE_KINDS, step_down
from vllm_omni_launcher.server.launch.spec import LaunchSpec, MemoryConfig, ParallelConfig, RuntimeConfig

T2V = "Wan-AI/Wan2.2-T2V-A14B-Diffusers"
I2V = "Wan-AI/Wan2.2-I2V-A14B-Diffusers"
TI2V = "Wan-AI/Wan2.2-TI2V-5B-Diffusers"

DONE_WHEN = [
    ("1x24GB TI2V-5B 1280x704x121", TI2V, RequestShape(1280, 704, 121), [24.0]),
    ("2x24GB T2V-A14B 832x480x81", T2V, RequestShape(832, 480, 81), [24.0, 24.0]),
    ("1x80GB I2V-A14B 1280x720x81", I2V, RequestShape(1280, 720, 81), [80.0]),
    ("2x141GB T2V-A14B 1280x720x81", T2V, RequestShape(1280, 720, 81), [141.0, 141.0]),
]


@pytest.mark.parametrize("name,model,req,gpus", DONE_WHEN, ids=[d[0] for d in DONE_WHEN])
def test_done_when_recommendations_validate_and_fit(name, model, req, gpus):
    rec = recommend(model, req, gpus, host_available_gib=256.0)
    assert rec.spec is not None, rec.text()
    assert not rec.reduced, rec.text()               # the full request, not a smaller one
    rec.spec.validate(visible_gpus=len(gpus))
    again = plan(rec.spec, req, gpus[:rec.spec.parallel.world_size], host_available_gib=256.0)
    assert again.fits is True
    assert all(g.fits for g in again.gpus)
    json.dumps(rec.to_dict())
    for r in rec.rejected:                           # each faster rung says why it does not fit
        assert r.fits is False and "GiB" in r.why_not


def test_two_h200_pick_cfg_parallel_fastest():
    """141 GB leaves room for the untiled decode on each GPU, which 0.30's costs rank before VAE patch 2's
    tiled one (speed_costs.JobTimes: 0.04 against 0.17 s per Mpx x frame)."""
    req = RequestShape(1280, 720, 81)
    rec = recommend(T2V, req, [141.0, 141.0], host_available_gib=256.0)
    assert rec.spec.parallel == ParallelConfig("cfg", 2, 1) and not rec.rejected
    assert rec.spec.memory.offload == "none" and not rec.spec.memory.vae_tiling
    assert speed_cost(rec.spec, True, req) < speed_cost(replace(rec.spec, parallel=ParallelConfig("cfg", 2, 2)),
                                                        True, req)


def test_cfg_off_prefers_ulysses():
    rec = recommend(T2V, RequestShape(1280, 720, 81, cfg=False), [141.0, 141.0], host_available_gib=256.0)
    assert rec.spec.parallel.mode == "ulysses"
    assert not any(r.spec.parallel.mode == "cfg" for r in build_ladder(
        LaunchSpec(T2V), hypothetical_gpus([141.0, 141.0]), RequestShape(1280, 720, 81, cfg=False))[0])


def test_80gb_i2v_720p_needs_offload_and_says_why():
    rec = recommend(I2V, RequestShape(1280, 720, 81), [80.0], host_available_gib=256.0)
    assert rec.spec.memory.offload != "none"
    assert rec.rejected and rec.rejected[0].label == "1 GPU, no offload"
    assert "needs" in rec.text()


def test_geforce_without_p2p_prefers_cfg_over_ulysses():
    gpus = hypothetical_gpus([24.0, 24.0], name="NVIDIA GeForce RTX 4090")
    rungs, notes = build_ladder(LaunchSpec(TI2V), gpus, RequestShape(832, 480, 81), p2p=False)
    modes = [r.spec.parallel.mode for r in rungs if r.spec.parallel.world_size == 2 and r.spec.memory.offload == "none"]
    assert modes.index("cfg") < modes.index("ulysses")
    assert all(m == "cfg" for m in modes[:modes.count("cfg")])
    every = [r.spec.parallel.mode for r in rungs]
    last_cfg = max(i for i, m in enumerate(every) if m == "cfg")
    assert all(m != "ulysses" and m != "tensor" for m in every[:last_cfg])   # CFG rungs, offload too, first
    assert any("without peer-to-peer access: CFG parallel" in n for n in notes)
    rec = recommend(TI2V, RequestShape(832, 480, 81), gpus, p2p=False, host_available_gib=64.0)
    assert rec.spec.parallel.mode == "cfg"
    assert any("without peer-to-peer access: CFG parallel" in n for n in rec.notes)
    # with peer-to-peer (or datacenter cards) the plain speed order applies: no GeForce reordering, and
    # 0.30's measured costs put CFG parallel with module offload before tensor parallel
    rec_p2p = recommend(TI2V, RequestShape(832, 480, 81), gpus, p2p=True, host_available_gib=64.0)
    assert not any("peer-to-peer" in n for n in rec_p2p.notes)
    assert rec_p2p.spec.parallel.mode == "cfg" and rec_p2p.spec.memory.offload == "module"


def test_datacenter_gpus_keep_cfg_then_ulysses_order_and_all_rungs_validate():
    gpus = [GpuInfo(0, "NVIDIA H100 80GB HBM3", 79.6), GpuInfo(1, "NVIDIA H100 80GB HBM3", 79.6)]
    rungs, _ = build_ladder(LaunchSpec(T2V), gpus, RequestShape(832, 480, 81), p2p=True)
    modes = [r.spec.parallel.mode for r in rungs]
    assert modes[0] == "cfg" and next(m for m in modes if m != "cfg") == "ulysses"
    for r in rungs:
        r.spec.validate(visible_gpus=2)
    # the slowest by the measured costs (SPEED_COSTS): module offload on one GPU (+32% engine time),
    # after layerwise offload (no slower per step on an H200)
    assert rungs[-1].spec.memory.offload == "module" and rungs[-1].spec.parallel.world_size == 1
    one_gpu = [r.spec.memory.offload for r in rungs if r.spec.parallel.world_size == 1]
    assert one_gpu.index("layerwise") < one_gpu.index("module")
    costs = [speed_cost(r.spec) for r in rungs]
    assert costs == sorted(costs)


def test_24gb_ti2v_picks_layerwise_untiled_and_says_the_expected_cost():
    """Measured on an H200 with 0.30: layerwise offload +1% engine time (50 steps, 1280x704x121), module +5%,
    VAE tiling +15% (a decode 4x slower); layerwise without tiling peaks at 20.6 GiB there, so it fits 24 GB."""
    rec = recommend(TI2V, RequestShape(1280, 704, 121), [24.0], host_available_gib=64.0)
    assert rec.spec.memory.offload == "layerwise" and not rec.spec.memory.vae_tiling
    assert "expected speed: " in rec.text() and "engine time" in rec.speed
    assert [r.label for r in rec.rejected] == ["1 GPU, no offload"]
    module = next(r for r in build_ladder(LaunchSpec(TI2V), hypothetical_gpus([24.0]), RequestShape(1280, 704, 121))[0]
                  if r.spec.memory.offload == "module" and not r.spec.memory.vae_tiling)
    assert "+5% engine time" in module.speed


def test_fp8_only_when_allowed_and_last():
    gpus = [24.0]
    rungs, notes = build_ladder(LaunchSpec(TI2V), hypothetical_gpus(gpus), RequestShape(1280, 704, 121))
    assert all(r.spec.memory.quantization == "none" for r in rungs)
    rungs, notes = build_ladder(LaunchSpec(TI2V), hypothetical_gpus(gpus), RequestShape(1280, 704, 121),
                                allow_fp8=True)
    q = [r.spec.memory.quantization for r in rungs]
    assert "fp8" in q and q.index("fp8") > max(i for i, x in enumerate(q) if x == "none")
    assert all(r.warnings for r in rungs if r.spec.memory.quantization == "fp8")


def test_nothing_fits_reduces_frames_then_size():
    rec = recommend(T2V, RequestShape(1280, 720, 81), [16.0], host_available_gib=256.0)
    if rec.spec is not None:
        assert rec.reduced
        assert rec.request.frames <= 81 and rec.request.width <= 1280
        assert plan(rec.spec, rec.request, [16.0], host_available_gib=256.0).fits
    tiny = recommend(T2V, RequestShape(1280, 720, 81), [4.0], host_available_gib=256.0)
    assert tiny.spec is None and "does not fit" in tiny.reason


def test_keeps_non_memory_settings_of_a_given_spec():
    base = LaunchSpec(T2V, port=8123, runtime=RuntimeConfig(enforce_eager=True), served_model_name="wan")
    rec = recommend(base, RequestShape(832, 480, 81), [141.0, 141.0], host_available_gib=256.0)
    assert rec.spec.port == 8123 and rec.spec.runtime.enforce_eager and rec.spec.served_model_name == "wan"


def test_recommend_without_gpus_says_how():
    with pytest.raises(LauncherError) as exc:
        recommend(T2V, None, None, nvml=broken_nvml())
    assert "--gpu-memory" in exc.value.fix


# ---- step_down ------------------------------------------------------------------------
def _walk(spec, kind, gpus, req):
    seen = [spec]
    while True:
        nxt = step_down(spec, kind, gpus, req, host_available_gib=256.0)
        if nxt is None:
            return seen
        spec, sentence = nxt
        spec.validate(visible_gpus=len(gpus))
        assert sentence.endswith(".") and "because" in sentence
        assert spec not in seen, "step_down must not loop"
        seen.append(spec)
        assert len(seen) < 30


@pytest.mark.parametrize("kind", [k for k in FAILURE_KINDS if k != "comm"])
def test_step_down_walks_to_the_bottom_and_terminates(kind):
    start = LaunchSpec(I2V, port=9001)
    chain = _walk(start, kind, [80.0], RequestShape(1280, 720, 81))
    assert len(chain) >= 2
    assert all(s.port == 9001 for s in chain)
    # never undoes an offload (module and layerwise are alternatives: which is leaner depends on the phase)
    offloaded = [s.memory.offload != "none" for s in chain]
    assert offloaded == sorted(offloaded)


def test_step_down_decode_oom_turns_tiling_on_first():
    spec, sentence = step_down(LaunchSpec(T2V), "oom_decode", [141.0], RequestShape(1280, 720, 81))
    assert spec == LaunchSpec(T2V, memory=MemoryConfig(vae_tiling=True)), "tiling on, and nothing else changed"
    assert sentence == "Turned VAE tiling on, because the VAE decode ran out of memory."


def test_step_down_from_two_gpus_and_bottom():
    start = LaunchSpec(T2V, gpus=(0, 1), parallel=ParallelConfig("ulysses", 2, 2))
    spec, sentence = step_down(start, "oom", [24.0, 24.0], RequestShape(832, 480, 81), host_available_gib=256.0)
    assert plan(spec, RequestShape(832, 480, 81), [24.0, 24.0], host_available_gib=256.0).fits
    bottom = LaunchSpec(T2V, memory=MemoryConfig(offload="layerwise", vae_tiling=True))
    assert step_down(bottom, "oom", [24.0], RequestShape(832, 480, 81)) is None


def test_step_down_comm_failure_goes_to_cfg_or_one_gpu():
    start = LaunchSpec(T2V, gpus=(0, 1), parallel=ParallelConfig("ulysses", 2, 2))
    spec, sentence = step_down(start, "comm", [141.0, 141.0], RequestShape(832, 480, 81))
    assert spec.parallel.mode in ("cfg", "none")
    assert step_down(LaunchSpec(T2V), "comm", [141.0], None) is None


def test_step_down_rejects_unknown_kind():
    with pytest.raises(ValueError):
        step_down(LaunchSpec(T2V), "segfault", [80.0], None)
