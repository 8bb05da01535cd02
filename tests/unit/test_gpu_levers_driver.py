"""The pure parts of the speed-lever bench (`python -m bench.gpu levers` and `native`'s variants): each lever
is a launch spec our own validation accepts and turns into the flags it names, each native variant is the
graph a user would build, the drift measure, and the tables of the committed results
(bench/results/h200-levers-vllm-omni-0.30/). The device runs themselves are rehearsed on CPU (README there)."""
from __future__ import annotations

import dataclasses
import json
import math
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
try:
    from bench.gpu import common, graphs, levers, report
finally:
    sys.path.remove(str(REPO))      # the repo root holds top-level names (server, nodes) ComfyUI also uses

from vllm_omni_launcher.planner.launch_plan import ServingChoice  # noqa: E402

RESULTS = REPO / "bench" / "results" / "h200-levers-vllm-omni-0.30"
REQUEST = {"prompt": "p", "negative": "n", "width": 1280, "height": 704, "frames": 121, "fps": 24, "steps": 20,
           "seed": 44}


def _spec(name: str):
    return levers.Levers.spec(SimpleNamespace(a=SimpleNamespace(model="Wan-AI/Wan2.2-TI2V-5B-Diffusers")), name)


@pytest.mark.parametrize("name", sorted(levers.CONFIGS))
def test_every_lever_is_a_valid_spec_with_the_flags_it_names(name):
    c = levers.CONFIGS[name]
    flags = _spec(name).flags()
    assert ("--enforce-eager" in flags) is not c.get("compile", False)
    quant = flags[flags.index("--quantization") + 1] if "--quantization" in flags else None
    assert quant == ("fp8" if c.get("fp8") else None)
    assert ("--cache-backend" in flags) is (c.get("cache_backend") == "cache_dit")
    extra = list(c.get("extra", ()))
    assert flags[len(flags) - len(extra):] == extra          # the allow-listed extra flags, last, as given


def test_the_cache_dit_knobs_are_the_json_vllm_omni_reads():
    for name, policy in (("cache_dit_scm_fast", "fast"), ("cache_dit_scm_medium", "medium")):
        flag, value = levers.CONFIGS[name]["extra"]
        assert flag == "--cache-config" and json.loads(value) == {"scm_steps_mask_policy": policy}


def test_a_config_item_may_carry_its_own_jobs():
    assert levers.parse_jobs("4+20".replace("+", ",")) == [4, 20] and levers.parse_jobs("20") == [20]


def test_psnr_is_inf_for_identical_frames_none_for_other_shapes_and_20log_for_a_known_error():
    a = np.zeros((2, 4, 4, 3), np.uint8)
    b = a.copy()
    b[...] = 1                                                  # every value off by 1: mse 1
    assert common.psnr(a, a.copy()) == math.inf
    assert common.psnr(a, a[:1]) is None and common.psnr(a, None) is None
    assert common.psnr(a, b) == round(20 * math.log10(255.0), 2)


def test_easycache_sits_between_the_model_patch_and_the_sampler():
    g = graphs.native_prompt(REQUEST, easycache=graphs.EASYCACHE)
    assert g["49"]["class_type"] == "EasyCache" and g["49"]["inputs"]["model"] == ["48", 0]
    assert g[graphs.KSAMPLER]["inputs"]["model"] == ["49", 0]
    assert {k: v for k, v in g["49"]["inputs"].items() if k != "model"} == graphs.EASYCACHE
    plain = graphs.native_prompt(REQUEST)
    assert "49" not in plain and plain[graphs.KSAMPLER]["inputs"]["model"] == ["48", 0]


def test_fp8_variants_load_the_unet_as_fp8_e4m3fn():
    for name, v in graphs.NATIVE_VARIANTS.items():
        g = graphs.native_prompt(REQUEST, weight_dtype=v.get("weight_dtype", "default"), easycache=v.get("easycache"))
        assert (g["37"]["inputs"]["weight_dtype"] == "fp8_e4m3fn") is ("fp8" in name)


def test_the_frame_sample_saves_four_middle_frames_of_the_image_output():
    g = graphs.sample_frames(graphs.native_prompt(REQUEST), [graphs.DECODE, 0], "bench/x-default-20", 121)
    assert g["94"]["inputs"] == {"image": [graphs.DECODE, 0], "batch_index": 40, "length": 4}
    assert g["95"] == {"class_type": "SaveImage", "inputs": {"images": ["94", 0], "filename_prefix": "bench/x-default-20"}}
    short = graphs.sample_frames(graphs.native_prompt(dict(REQUEST, frames=5)), [graphs.DECODE, 0], "p", 5)
    assert short["94"]["inputs"]["batch_index"] == 1 and short["94"]["inputs"]["length"] == 4


def test_our_variants_are_serving_config_values_with_exactly_these_settings():
    widgets = {f.name for f in dataclasses.fields(ServingChoice)}
    for v in graphs.OURS_VARIANTS.values():
        assert set(v) <= widgets
        assert (v["parallel_mode"], v["offload"], v["vae_tiling"]) == ("none", "none", False)   # no planner choice


def test_the_committed_tables_carry_the_measured_levers():
    lev = report.levers_table(json.loads((RESULTS / "levers.json").read_text()))
    rows = {line.split(" | ")[0].lstrip("| "): line for line in lev.splitlines()[2:] if "| client | 20 |" in line}
    assert {"eager", "compile", "fp8", "cache_dit"} <= set(rows)
    assert "| 1.62 |" in rows["fp8"] and "| 1.66 |" in rows["compile"] and "| 1.76 |" in rows["eager"]
    runs = report.runs_table(json.loads((RESULTS / "native-fast-comfyui.json").read_text()))
    assert "| native | fp8-20 | 48.87 | 2.156 |" in runs
    ours = report.runs_table(json.loads((RESULTS / "native-default-comfyui.json").read_text()))
    assert "| ours | compile_fp8_cache_dit-20 | 36.21 | 1.479 |" in ours
