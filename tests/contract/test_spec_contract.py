"""Every launch spec the nodes can produce, checked against the REAL vLLM-Omni 0.30 parser
and config resolution (tests/contract/upstream_resolve.py, run in the server environment).

- A spec we accept must parse upstream and resolve to the parallel config we meant
  (world size, degrees, devices, offload, quantization, tiling, cache, compile).
- A spec we reject must be one upstream refuses (same reason) or mis-handles; the table
  REJECTIONS says which, and the test checks upstream really behaves that way.
"""
from __future__ import annotations

import itertools

import pytest

from vllm_omni_launcher.errors import SpecError
from vllm_omni_launcher.server.launch.flags import NONEXISTENT_FLAGS
from vllm_omni_launcher.server.launch.spec import LaunchSpec, MemoryConfig, ParallelConfig, RuntimeConfig

MODELS = ("Wan-AI/Wan2.2-T2V-A14B-Diffusers", "Wan-AI/Wan2.2-I2V-A14B-Diffusers", "Wan-AI/Wan2.2-TI2V-5B-Diffusers")
VISIBLE = 8

# What our rejection means upstream: ("refuses", text upstream prints) or ("mishandles", how).
REJECTIONS = {
    "needs": ("refuses", "Stage 0 requires"),
    "spare_gpus": ("mishandles", "world size is smaller than the GPUs given: the extra GPUs sit idle"),
    "layerwise_parallel": ("mishandles", "accepted at config time; upstream docs: layerwise offload is single-card "
                                         "only, incompatible with SP/CFG/TP/HSDP"),
    "tp_hsdp": ("refuses", "HSDP (FSDP2) is not compatible with TP"),
    "heads": ("mishandles", "accepted at config time; strict Ulysses needs heads divisible by the degree and "
                            "fails in the first forward"),
    "tp_split": ("mishandles", "accepted at config time; vLLM's parallel linear layers refuse a tensor parallel "
                               "degree that does not split the heads and feed-forward width evenly, at load"),
    "cfg_degree": ("mishandles", "accepted with world 4; CFG has two branches, so two ranks have no work"),
    "vae_patch": ("mishandles", "accepted; VAE patch parallel larger than (or not dividing) the DiT world "
                                "is outside the process group the VAE decode runs in"),
    "fake_flag": ("refuses", "unrecognized arguments"),
    "local_only": ("policy", "upstream accepts it; a shared workflow must not choose it (security policy)"),
}


def _category(err: SpecError, spec: LaunchSpec) -> str:
    text = str(err)
    if "selected but the parallel config uses" in text:
        return "spare_gpus"
    if "needs" in text and "GPUs but" in text:
        return "needs"
    if err.setting == "offload":
        return "layerwise_parallel"
    if "not compatible with TP" in text:
        return "tp_hsdp"
    if "Tensor parallel degree" in text:
        return "tp_split"
    if "attention heads" in text:
        return "heads"
    if "exactly two passes" in text:
        return "cfg_degree"
    if err.setting == "vae_patch_parallel":
        return "vae_patch"
    if "does not exist" in text:
        return "fake_flag"
    if "cannot be set from a workflow" in text:
        return "local_only"
    raise AssertionError(f"uncategorised rejection: {text}")


def node_matrix() -> list[LaunchSpec]:
    """The Serving config node's whole space (modes x degrees x VAE patch x offload per model),
    with the boolean switches rotated through all 16 combinations so each appears everywhere."""
    switches = list(itertools.product((False, True), repeat=4))   # fp8, tiling, cache_dit, eager
    specs = []
    modes = [("none", 1)] + [(m, d) for m in ("tensor", "ulysses", "ring", "cfg", "hsdp") for d in (2, 4)]
    for i, (model, (mode, degree), vae_patch, offload) in enumerate(
            itertools.product(MODELS, modes, (1, 2, 4), ("none", "module", "layerwise"))):
        fp8, tiling, cache, eager = switches[i % len(switches)]
        specs.append(LaunchSpec(
            model, gpus=tuple(range(degree)), parallel=ParallelConfig(mode, degree, vae_patch),
            memory=MemoryConfig(offload, "fp8" if fp8 else "none", tiling),
            runtime=RuntimeConfig("cache_dit" if cache else "none", eager,
                                  boundary_ratio=0.9 if i % 5 == 0 else None, flow_shift=12.0 if i % 7 == 0 else None)))
    # CLI-only overlays and GPU-count mismatches
    for model, mode in itertools.product(MODELS, ("ulysses", "ring", "cfg", "tensor")):
        specs.append(LaunchSpec(model, gpus=(0, 1), parallel=ParallelConfig(mode, 2, hsdp=True)))
        specs.append(LaunchSpec(model, gpus=(0,), parallel=ParallelConfig(mode, 2)))
        specs.append(LaunchSpec(model, gpus=(0, 1, 2, 3), parallel=ParallelConfig(mode, 2)))
    for model in MODELS:
        specs.append(LaunchSpec(model, gpus=(0, 1, 2), parallel=ParallelConfig("ulysses", 3)))
        specs.append(LaunchSpec(model, gpus=(0, 1, 2), parallel=ParallelConfig("tensor", 3)))
        specs.append(LaunchSpec(model, gpus=(0, 1, 2), parallel=ParallelConfig("ulysses", 3,
                                                                                ulysses_mode="advanced_uaa")))
        specs.append(LaunchSpec(model, gpus=(0, 1), parallel=ParallelConfig("ulysses", 2, vae_patch=2), served_model_name="wan"))
        for flag in list(NONEXISTENT_FLAGS)[:5] + ["--trust-remote-code"]:
            value = () if flag in ("--no-enable-paged-attention", "--enable-gradient-checkpointing",
                                   "--trust-remote-code") else ("2",)
            specs.append(LaunchSpec(model, extra_flags=(flag, *value)))
    return specs


@pytest.fixture(scope="module")
def resolved(upstream_resolver) -> list[tuple[LaunchSpec, object, dict]]:
    specs = node_matrix()
    outcomes: list[object] = []
    cases = []
    for spec in specs:
        try:
            spec.validate(visible_gpus=VISIBLE)
            outcomes.append(None)
        except SpecError as err:
            outcomes.append(err)
        argv = spec.build(["vllm"], 8000, api_key=None).argv[1:]
        cases.append({"argv": argv, "visible_devices": len(spec.gpus) if spec.gpus else VISIBLE})
    results = upstream_resolver.resolve(cases, timeout=1800)
    assert len(results) == len(specs)
    return list(zip(specs, outcomes, results))


def test_matrix_is_large_and_mixed(resolved):
    accepted = [s for s, err, _ in resolved if err is None]
    rejected = [s for s, err, _ in resolved if err is not None]
    assert len(resolved) > 300 and len(accepted) > 100 and len(rejected) > 50


def test_accepted_specs_resolve_upstream_to_what_we_meant(resolved):
    for spec, err, result in resolved:
        if err is not None:
            continue
        argv = " ".join(spec.build(["vllm"], 8000, None).argv)
        assert result["ok"], f"upstream refused an accepted spec: {argv}\n{result}"
        cfg = result["config"]
        p, m, r = spec.parallel, spec.memory, spec.runtime
        assert cfg["world_size"] == p.world_size, argv
        assert cfg["tensor_parallel_size"] == (p.degree if p.mode == "tensor" else 1), argv
        assert cfg["ulysses_degree"] == (p.degree if p.mode == "ulysses" else 1), argv
        assert cfg["ring_degree"] == (p.degree if p.mode == "ring" else 1), argv
        assert cfg["cfg_parallel_size"] == (p.degree if p.mode == "cfg" else 1), argv
        assert cfg["vae_patch_parallel_size"] == p.vae_patch, argv
        assert cfg["use_hsdp"] == (p.mode == "hsdp" or p.hsdp), argv
        if cfg["use_hsdp"]:
            assert cfg["hsdp_shard_size"] == p.world_size, argv
        assert len(cfg["devices"]) == p.world_size, argv
        assert cfg["enable_cpu_offload"] == (m.offload == "module"), argv
        assert cfg["enable_layerwise_offload"] == (m.offload == "layerwise"), argv
        assert (cfg["quantization"] is not None and "fp8" in str(cfg["quantization"]).lower()) == \
            (m.quantization == "fp8"), argv
        assert cfg["vae_use_tiling"] == m.vae_tiling, argv
        assert cfg["cache_backend"] == r.cache_backend, argv
        assert cfg["enforce_eager"] == r.enforce_eager, argv
        assert cfg["boundary_ratio"] == r.boundary_ratio, argv
        assert cfg["flow_shift"] == r.flow_shift, argv


def test_rejected_specs_are_refused_or_mishandled_upstream(resolved):
    seen = set()
    for spec, err, result in resolved:
        if err is None:
            continue
        category = _category(err, spec)
        seen.add(category)
        kind, detail = REJECTIONS[category]
        argv = " ".join(spec.build(["vllm"], 8000, None).argv)
        if category == "needs" and spec.family.key == "i2v_a14b":
            # I2V-A14B takes upstream's generic diffusion path, which skips the device-count check:
            # it resolves devices that are not visible and fails later, at worker start.
            assert result["ok"] and len(result["config"]["devices"]) > len(spec.gpus), argv
        elif kind == "refuses":
            assert not result["ok"] and detail in result["error"], f"{category}: upstream did not refuse {argv}: {result}"
        elif category == "spare_gpus":
            assert result["ok"] and result["config"]["world_size"] < len(spec.gpus), argv
        elif category == "cfg_degree":
            assert result["ok"] and result["config"]["cfg_parallel_size"] == spec.parallel.degree, argv
        else:  # mishandles / policy: upstream accepts at config time, which is why we must refuse
            assert result["ok"], f"{category}: expected upstream to accept {argv}: {result}"
    assert {"needs", "spare_gpus", "layerwise_parallel", "tp_hsdp", "heads", "tp_split", "cfg_degree", "vae_patch",
            "fake_flag", "local_only"} <= seen


def test_every_nonexistent_flag_is_unknown_to_the_real_parser(upstream_resolver):
    cases = [{"argv": ["serve", MODELS[0], "--omni", flag, "2"], "visible_devices": 1} for flag in NONEXISTENT_FLAGS
             if flag != "--num-gpus"]
    results = upstream_resolver.resolve(cases, timeout=600)
    assert len(results) == len(cases)
    for case, result in zip(cases, results):
        assert not result["ok"] and "unrecognized arguments" in result["error"], case


def test_num_gpus_is_accepted_but_ignored_upstream(upstream_resolver):
    """--num-gpus is refused (MISLEADING_FLAGS) because it does nothing: upstream keeps world size 1."""
    cases = [{"argv": ["serve", MODELS[0], "--omni", "--num-gpus", "2"], "visible_devices": 2}]
    result = upstream_resolver.resolve(cases, timeout=600)[0]
    assert result["ok"] and result["config"]["world_size"] == 1
