"""The OOM step-down's own rules, each on a case where breaking it changes the answer: a decode OOM
turns VAE tiling on and nothing else, a step never undoes FP8, and a leaner rung must lower the
failing peak by at least MIN_GAIN_GIB (a smaller gain is within the estimate's error)."""
from __future__ import annotations

from dataclasses import replace

import pytest

from vllm_omni_launcher.planner.gpus import hypothetical_gpus
from vllm_omni_launcher.planner.memory import RequestShape, plan
from vllm_omni_launcher.planner import step_down as STEP_DOWN
from vllm_omni_launcher.planner.step_down import MIN_GAIN_GIB, step_down
from vllm_omni_launcher.server.launch.spec import LaunchSpec, MemoryConfig, ParallelConfig

TI2V = "Wan-AI/Wan2.2-TI2V-5B-Diffusers"
T2V = "Wan-AI/Wan2.2-T2V-A14B-Diffusers"


@pytest.mark.parametrize("spec", [
    LaunchSpec(model=TI2V),
    LaunchSpec(model=T2V, memory=MemoryConfig(offload="layerwise")),
    LaunchSpec(model=T2V, gpus=(0, 1), parallel=ParallelConfig("cfg", 2, 1), memory=MemoryConfig(offload="module")),
])
def test_a_decode_oom_turns_vae_tiling_on_and_changes_nothing_else(spec):
    new, sentence = step_down(spec, "oom_decode", [24.0] * spec.gpu_count)
    assert new == replace(spec, memory=replace(spec.memory, vae_tiling=True))
    assert sentence == "Turned VAE tiling on, because the VAE decode ran out of memory."


@pytest.mark.parametrize("allow_fp8", [False, True])
@pytest.mark.parametrize("kind", ["oom", "oom_load", "oom_denoise"])
def test_a_step_down_never_undoes_fp8(allow_fp8, kind):
    spec = LaunchSpec(model=T2V, memory=MemoryConfig(quantization="fp8", vae_tiling=True))
    out = step_down(spec, kind, [40.0], allow_fp8=allow_fp8)
    assert out is None or out[0].memory.quantization == "fp8", out
    if allow_fp8:
        assert out is not None and out[0].memory.offload != "none"     # leaner, and still FP8


def _peak(spec: LaunchSpec, phase, sizes, request: RequestShape) -> float:
    gpus = hypothetical_gpus(sizes)
    if spec.gpus is not None:
        gpus = [replace(g, index=i) for g, i in zip(gpus, spec.gpus)]
    used = [g for g in gpus if spec.gpus is None or g.index in spec.gpus] or gpus
    p = plan(spec, request, used, host_available_gib=None)
    return max(g.torch_peak_gib if phase is None else g.phases.get(phase, 0.0) for g in p.gpus)


# Each case: the nearest leaner rung lowers the failing peak by less than the margin, and a later one by more.
@pytest.mark.parametrize("spec,kind,phase,request_shape,sizes", [
    # CFG parallel OOMs while denoising: Ulysses would lower that peak by ~0.02 GiB, CFG parallel + HSDP by ~0.35
    (LaunchSpec(model=TI2V, gpus=(0, 1), parallel=ParallelConfig("cfg", 2, 2)), "oom_denoise", "denoise",
     RequestShape(width=1024, height=576, frames=97), [32.0, 32.0]),
    # Ulysses + VAE tiling OOMs (phase unknown): Ulysses + HSDP would lower the peak by ~0.1 GiB, TP 2 by ~5
    (LaunchSpec(model=TI2V, gpus=(0, 1), parallel=ParallelConfig("ulysses", 2, 1), memory=MemoryConfig(vae_tiling=True)),
     "oom", None, RequestShape(width=1280, height=704, frames=121, cfg=False), [40.0, 40.0]),
])
def test_a_rung_that_gains_less_than_the_margin_is_passed_over(spec, kind, phase, request_shape, sizes, monkeypatch):
    before = _peak(spec, phase, sizes, request_shape)
    new, _ = step_down(spec, kind, sizes, request_shape)
    monkeypatch.setattr(STEP_DOWN, "MIN_GAIN_GIB", 0.0)
    nearest, _ = step_down(spec, kind, sizes, request_shape)         # what the walk takes without the margin
    assert new != nearest, "the step took the nearest leaner rung: the margin was not applied"
    assert 0 < before - _peak(nearest, phase, sizes, request_shape) < MIN_GAIN_GIB    # it gains only a little
    assert before - _peak(new, phase, sizes, request_shape) >= MIN_GAIN_GIB


# The margin is 0.25 GiB: the same failing server (Ulysses 2 + VAE tiling, OOM of unknown phase) whose nearest
# leaner rung gains just under it for one request and just over it for a slightly smaller one.
ULYSSES_TILED = LaunchSpec(model=TI2V, gpus=(0, 1), parallel=ParallelConfig("ulysses", 2, 1),
                           memory=MemoryConfig(vae_tiling=True))


@pytest.mark.parametrize("request_shape, gain_range, taken", [
    (RequestShape(width=1280, height=720, frames=97, cfg=False), (0.24, 0.25), False),    # gains ~0.246 GiB
    (RequestShape(width=1280, height=704, frames=97, cfg=False), (0.25, 0.27), True),     # gains ~0.262 GiB
])
def test_the_margin_is_a_quarter_gib_on_both_sides(request_shape, gain_range, taken, monkeypatch):
    sizes = [40.0, 40.0]
    before = _peak(ULYSSES_TILED, None, sizes, request_shape)
    new, _ = step_down(ULYSSES_TILED, "oom", sizes, request_shape)
    monkeypatch.setattr(STEP_DOWN, "MIN_GAIN_GIB", 0.0)
    nearest, _ = step_down(ULYSSES_TILED, "oom", sizes, request_shape)
    gain = before - _peak(nearest, None, sizes, request_shape)
    assert gain_range[0] < gain < gain_range[1], f"the case no longer sits at the margin (gain {gain:.3f} GiB)"
    assert (new == nearest) is taken, (f"a gain of {gain:.3f} GiB must be " + ("taken" if taken else "passed over"))
