"""What the shipped templates ask of the planner: each template's request obeys its model's rules, its
serving config resolves to a valid launch spec on the GPUs its Note asks for, and its Note says what the
planner picks (TI2V: per card size and free system RAM; A14B: the planned peak per GPU). Without ComfyUI
(tests/helpers/workflow_defs.py reads the templates as the front end does).
"""
from __future__ import annotations

import re
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import psutil
import pytest

import stubserver
from vllm_omni_launcher.models import FAMILIES, check_request, family_for
from vllm_omni_launcher.nodes.handles import ModelChoice, ServingChoice
from vllm_omni_launcher.planner.launch_plan import GPU_MEMORY_ENV
from vllm_omni_launcher.server.config.local_config import LocalConfig
from workflow_defs import JOB_NODES, LOAD_NODES, TEMPLATES, NodeDef, load, node_defs, nodes_of, ui_path, widgets_by_name

defs_fixture = pytest.fixture(scope="module", name="defs")(node_defs)


def _generate_request(name: str, defs: dict[str, NodeDef]) -> tuple[Any, dict, bool]:
    ui = load(ui_path(name))
    (gen,) = [n for n in ui["nodes"] if n["type"] in JOB_NODES]
    values = widgets_by_name(defs[gen["type"]], gen)
    has_image = any(i["name"] == "image" and i.get("link") is not None for i in gen["inputs"])
    loaders = [n for kind in LOAD_NODES for n in nodes_of(ui, kind)]
    if loaders:
        family = family_for(loaders[0]["widgets_values"][0])
    else:
        family = FAMILIES[nodes_of(ui, "VLLMOmniRemoteServer")[0]["widgets_values"][1]]
    return family, values, has_image


@pytest.mark.parametrize("name", TEMPLATES)
def test_template_request_obeys_its_model_rules(name, defs):
    family, values, has_image = _generate_request(name, defs)
    assert values.get("prompt", values.get("prompts")).strip()
    check_request(family, width=values["width"] or family.width, height=values["height"] or family.height,
                  frames=values["frames"] or family.frames, has_image=has_image)
    expected_image = {"wan22_ti2v_5b_image_to_video": True, "wan22_i2v_a14b_2gpu_cfg": True,
                      "wan22_s2v_speech_to_video": True}.get(name, False)
    assert has_image == expected_image


LOCAL_TEMPLATES = {   # template -> (GPU memory its Note asks for, expected parallel layout)
    "wan22_ti2v_5b_text_to_video": ("16", None),
    "wan22_ti2v_5b_image_to_video": ("16", None),
    "wan22_ti2v_5b_seed_sweep": ("16", None),
    "wan22_t2v_a14b_2gpu_ulysses": ("80,80", ("ulysses", 2, 2, (0, 1))),
    "wan22_i2v_a14b_2gpu_cfg": ("80,80", ("cfg", 2, 2, (0, 1))),
    "wan22_t2v_a14b_4step_lora": ("80,80", ("ulysses", 2, 2, (0, 1))),
    "wan21_vace_control_video": ("24", None),
    "wan22_s2v_speech_to_video": ("80", None),
    "fastwan_ti2v_5b_fast_text_to_video": ("40", None),
}


@pytest.fixture
def stub_config(server_env_python: str) -> LocalConfig:
    """The launcher checks the server environment's vllm / vllm-omni pair: use the stub's (0.30).
    Without the server environment the test is skipped, saying so."""
    return LocalConfig(server_command=(server_env_python, stubserver.STUB_SCRIPT))


def _template_choices(name: str, defs: dict[str, NodeDef]) -> tuple[Any, Any]:
    """What the template's Load Model and Serving Config nodes output."""
    ui = load(ui_path(name))
    (loader,) = [n for kind in LOAD_NODES for n in nodes_of(ui, kind)]
    model = defs[loader["type"]].cls.call({"model": loader["widgets_values"][0]})[0]
    serving_values = widgets_by_name(defs["VLLMOmniServingConfig"], nodes_of(ui, "VLLMOmniServingConfig")[0])
    return model, defs["VLLMOmniServingConfig"].cls.call(serving_values)[0]


def _note(name: str) -> str:
    return nodes_of(load(ui_path(name)), "Note")[0]["widgets_values"][0]


@pytest.mark.parametrize("name", sorted(LOCAL_TEMPLATES))
def test_template_serving_config_resolves_to_a_valid_launch_spec(name, defs, stub_config, monkeypatch):
    memory, layout = LOCAL_TEMPLATES[name]
    monkeypatch.setenv(GPU_MEMORY_ENV, memory)
    # a machine with 64 GB of free system RAM (what the TI2V Notes assume), not this busy box's
    monkeypatch.setattr(psutil, "virtual_memory", lambda: SimpleNamespace(available=64 * 2**30))
    model, serving = _template_choices(name, defs)
    assert isinstance(model, ModelChoice) and isinstance(serving, ServingChoice)
    plan = serving.resolve(model.model, stub_config)
    spec = plan.spec
    assert spec.validate(visible_gpus=len(memory.split(","))) == []      # no warnings either
    assert plan.fallback is not None, "auto_fallback is on in every template"
    if layout is None:       # 'auto' on one 16 GB GPU: the planner chose, and said so
        assert serving.parallel_mode == "auto" and plan.text.startswith("Recommended: ")
        assert spec.parallel.world_size <= 1
    else:
        mode, degree, vae_patch, gpus = layout
        assert (spec.parallel.mode, spec.parallel.degree, spec.parallel.vae_patch, spec.gpus) == \
            (mode, degree, vae_patch, gpus)


# The TI2V templates serve with 'auto': what the planner picks for their defaults (Generate's widgets
# are all 0) on the machines their Note describes, and the Note's words for each.
TI2V_NOTES = ["wan22_ti2v_5b_text_to_video", "wan22_ti2v_5b_image_to_video", "wan22_ti2v_5b_seed_sweep"]
TI2V_PLANS = [   # ((GPU GiB, free system RAM GiB), planner's choice, frames it reduces the default to, Note)
    ((80, 64), "1 GPU, no offload", None, "on 40 GB or more no offload;"),
    ((40, 64), "1 GPU, no offload", None, "on 40 GB or more no offload;"),
    ((24, 64), "1 GPU + layerwise offload", None, "on a 24 GB card layerwise offload;"),
    ((16, 64), "1 GPU + layerwise offload + VAE tiling", None,
     "on 16 GB layerwise offload + VAE tiling, still at the full 121 frames;"),
    ((8, 64), "1 GPU + layerwise offload + VAE tiling", 33,
     "on smaller cards it lowers the frame count (33 frames on 8 GB)"),
]


@pytest.mark.parametrize("name", TI2V_NOTES)
@pytest.mark.parametrize("machine,label,frames,words", TI2V_PLANS)
def test_ti2v_note_says_what_the_planner_picks_for_the_template_defaults(name, machine, label, frames, words, defs):
    from vllm_omni_launcher.planner.ladder import recommend
    from vllm_omni_launcher.server.launch.spec import LaunchSpec

    note = _note(name)
    assert words in note and "With vLLM-Omni 0.30 (what setup installs)" in note
    model, serving = _template_choices(name, defs)
    assert serving.parallel_mode == "auto" and serving.gpus == "auto"
    gpu, ram = machine
    rec = recommend(LaunchSpec(model=model.model), gpus=[gpu], host_available_gib=ram, server_version=(0, 30))
    assert rec.label == label
    assert (rec.request.frames if rec.reduced else None) == frames
    assert rec.asked.label() == "1280x704x121" and "1280x704, 121 frames" in note


@pytest.mark.parametrize("name", TI2V_NOTES)
def test_ti2v_note_names_the_free_system_ram_layerwise_offload_needs(name, defs):
    """With the RAM the Note names, a 24 GB card still gets layerwise offload; with 1 GB less it does not
    (layerwise keeps the DiT and, on 0.30, the text encoder's blocks in pinned host RAM)."""
    from vllm_omni_launcher.planner.ladder import recommend
    from vllm_omni_launcher.server.launch.spec import LaunchSpec

    need = re.search(r"Layerwise offload needs about (\d+) GB of free system RAM", _note(name))
    assert need, _note(name)
    model, _ = _template_choices(name, defs)
    enough, short = (recommend(LaunchSpec(model=model.model), gpus=[24], host_available_gib=float(ram),
                               server_version=(0, 30)) for ram in (int(need[1]), int(need[1]) - 1))
    assert enough.label == "1 GPU + layerwise offload" and not enough.reduced
    assert short.spec is None or short.spec.memory.offload != "layerwise"


# The one-GPU templates serve with gpus 'auto' and parallel_mode 'auto', which take both GPUs of a pair: the Note
# says so (the planner's mode per pair, from the card size it asks for) and how to keep the second GPU free.
TWO_GPU_PLANS = {   # template -> [(GB per card, the planner's mode, the Note's words for it)]
    **{name: [(16, "tensor", "tensor parallel 2 on 16 GB, "), (20, "tensor", None),
              (24, "cfg", "CFG parallel 2 on 24 GB or more)"), (80, "cfg", None)] for name in TI2V_NOTES},
    "wan21_vace_control_video": [(24, "cfg", "uses both (CFG parallel 2);"), (80, "cfg", None)],
    "wan22_s2v_speech_to_video": [(80, "cfg", "uses both (CFG parallel 2);"), (141, "cfg", None)],
    "fastwan_ti2v_5b_fast_text_to_video": [(40, "tensor", "tensor parallel 2 on 40 GB, "),
                                           (48, "ulysses", "Ulysses 2 on 48 GB or more)"),
                                           (80, "ulysses", None)],
}
KEEP_ONE_GPU = "gpus count=1 in Serving Config keeps the second free"


@pytest.mark.parametrize("name", sorted(TWO_GPU_PLANS))
def test_one_gpu_note_says_auto_takes_both_gpus_of_a_pair_and_how_to_keep_one_free(name, defs):
    from vllm_omni_launcher.planner.ladder import recommend
    from vllm_omni_launcher.server.launch.spec import LaunchSpec

    note = _note(name)
    title = note.split("\n", 1)[0]
    assert title.endswith("; needs one GPU") and "on one GPU" not in note, title
    smallest = TWO_GPU_PLANS[name][0][0]
    assert f"With two GPUs of {smallest} GB or more 'auto' uses both (" in note and KEEP_ONE_GPU in note
    model, serving = _template_choices(name, defs)
    assert serving.parallel_mode == "auto" and serving.gpus == "auto"
    for gpu, mode, words in TWO_GPU_PLANS[name]:
        rec = recommend(LaunchSpec(model=model.model), gpus=[gpu, gpu], host_available_gib=64, server_version=(0, 30))
        assert (rec.spec.parallel.mode, rec.spec.parallel.world_size, rec.reduced) == (mode, 2, False), rec.label
        assert words is None or words in note, (gpu, words)


@pytest.mark.parametrize("name", sorted(TWO_GPU_PLANS))
def test_on_two_gpus_the_template_takes_both_and_count_1_leaves_the_second_free(name, defs, stub_config,
                                                                                  monkeypatch):
    """What the Note says, through Serving Config's own resolve (what Local Server launches)."""
    gpu = TWO_GPU_PLANS[name][0][0]
    monkeypatch.setenv(GPU_MEMORY_ENV, f"{gpu},{gpu}")
    monkeypatch.setattr(psutil, "virtual_memory", lambda: SimpleNamespace(available=64 * 2**30))
    model, serving = _template_choices(name, defs)
    both = serving.resolve(model.model, stub_config).spec
    one = replace(serving, gpus="count=1").resolve(model.model, stub_config).spec
    assert both.gpus == (0, 1) and both.parallel.world_size == 2
    assert one.gpus == (0,) and one.parallel.world_size <= 1


@pytest.mark.parametrize("name", ["wan22_t2v_a14b_2gpu_ulysses", "wan22_i2v_a14b_2gpu_cfg",
                                  "wan22_t2v_a14b_4step_lora"])
def test_a14b_note_states_the_planned_peak_of_its_serving_config(name, defs, stub_config, monkeypatch):
    from vllm_omni_launcher.planner.memory import plan as memory_plan

    monkeypatch.setenv(GPU_MEMORY_ENV, "80,80")
    model, serving = _template_choices(name, defs)
    spec = serving.resolve(model.model, stub_config).spec
    estimate = memory_plan(spec, None, [80, 80], host_available_gib=None)
    note = _note(name)
    peak = re.search(r"planned peak about (\d+) GiB per GPU", note, re.I)
    assert peak and "80 GB or more each" in note and estimate.fits
    assert abs(estimate.peak_gib - int(peak[1])) <= 1.0, (estimate.peak_gib, peak[0])


def test_a_plan_that_reduces_the_default_request_says_generate_applies_it(defs, stub_config, monkeypatch):
    from vllm_omni_launcher.planner import ladder

    real = ladder.recommend
    monkeypatch.setattr("vllm_omni_launcher.planner.launch_plan.recommend",
                        lambda base, **kw: real(base, host_available_gib=64, **kw))
    monkeypatch.setenv(GPU_MEMORY_ENV, "8")                                                    # a small card
    model, serving = _template_choices("wan22_ti2v_5b_text_to_video", defs)
    plan = serving.resolve(model.model, stub_config)
    assert (plan.limit.width, plan.limit.height, plan.limit.frames) == (1280, 704, 33)
    assert "request reduced: 1280x704x121 -> 1280x704x33" in plan.text
    assert "Generate Video uses 1280x704x33 where its width, height and frames are 0" in plan.text
    assert not re.search(r"not [^\n]*: *$", plan.text, re.M), "a rejected configuration without a reason"

