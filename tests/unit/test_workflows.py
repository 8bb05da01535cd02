"""The shipped templates in workflows/ as files: format, node definitions, API twins, released copies.

Runs without ComfyUI. ComfyUI shows every ``workflows/*.json`` of a pack as a template; the
front end stores widget values by *position* (``widgets_values``), so a template breaks when a
node's widgets are reordered, retyped or inserted anywhere but at the end. These tests read
the files the way the front end does (docs/upstream-facts.md, "ComfyUI workflow JSON";
tests/helpers/workflow_defs.py):

* every node type exists (ours, or a core node described in ``CORE_NODES``, whose
  description ``tests/comfyui/run_real_comfyui.py`` compares with a real ComfyUI's
  ``/object_info``);
* ``widgets_values`` map onto today's node inputs in order, with the front-end-only
  values (``control_after_generate`` after a seed, LoadImage's ``upload``) in their places,
  and every value is valid (type, range, combo option);
* each UI workflow converts to exactly its API twin ``workflows/api/<name>.api.json``;
* the frozen copies in ``released_workflows/`` still load: values only ever appended, API
  twins still carry every required input;
* what a template holds: its Note, example image, the seed sweep's seeds, no paths or secrets.

What the templates plan is test_template_plans.py's, a run of one on the stub test_template_run_on_stub.py's.
"""
from __future__ import annotations

import copy
import json
import re

import pytest

from vllm_omni_launcher.nodes.batch_session import clip_plan
from vllm_omni_launcher.planner.queued_prompt import prompt_lines
from vllm_omni_launcher.server.config.local_config import LocalConfig
from workflow_defs import (API_DIR, CORE_NODES, EXPECTED_TEMPLATES, JOB_NODES, RELEASED, TEMPLATES, VIRTUAL_NODES,
                           Widget, api_input_problems, api_path, links_by_id, load, node_defs, nodes_of, strings_in,
                           ui_path, ui_to_api, widget_problems, widgets_by_name)

defs_fixture = pytest.fixture(scope="module", name="defs")(node_defs)


# --------------------------------------------------------------------------- the shipped set
def test_the_shipped_templates_are_the_documented_ones_each_with_an_api_twin():
    assert set(TEMPLATES) == EXPECTED_TEMPLATES
    assert {p.name for p in API_DIR.glob("*.json")} == {f"{n}.api.json" for n in EXPECTED_TEMPLATES}


def test_no_api_format_file_sits_where_comfyui_lists_templates():
    # ComfyUI lists every workflows/*.json in the template browser; an API prompt is not a graph.
    for name in TEMPLATES:
        data = load(ui_path(name))
        assert "nodes" in data and "links" in data, f"{name}.json is not a UI workflow"
        assert "class_type" not in json.dumps(data), f"{name}.json looks like an API prompt"


@pytest.mark.parametrize("name", TEMPLATES)
def test_ui_workflow_is_frontend_format_0_4_with_consistent_links(name):
    ui = load(ui_path(name))
    assert ui["version"] == 0.4
    for key in ("last_node_id", "last_link_id", "nodes", "links", "groups", "config", "extra"):
        assert key in ui, key
    ids = [n["id"] for n in ui["nodes"]]
    assert len(ids) == len(set(ids)), "duplicate node ids"
    assert ui["last_node_id"] >= max(ids)
    nodes = {n["id"]: n for n in ui["nodes"]}
    links = links_by_id(ui)
    assert len(links) == len(ui["links"]), "duplicate link ids"
    assert not links or ui["last_link_id"] >= max(links)
    for link_id, (lid, src, src_slot, dst, dst_slot, kind) in links.items():
        assert src in nodes and dst in nodes, f"link {lid} joins missing nodes"
        out = nodes[src]["outputs"][src_slot]
        inp = nodes[dst]["inputs"][dst_slot]
        assert link_id in (out.get("links") or []), f"link {lid} not listed on its output"
        assert inp.get("link") == link_id, f"link {lid} not set on its input"
        assert out["type"] == inp["type"] == kind, f"link {lid}: {out['type']} -> {inp['type']} as {kind}"
    for node in ui["nodes"]:   # and no slot points at a link that does not exist
        for inp in node.get("inputs") or []:
            assert inp.get("link") is None or inp["link"] in links
        for out in node.get("outputs") or []:
            assert all(lid in links for lid in out.get("links") or [])


@pytest.mark.parametrize("name", TEMPLATES)
def test_every_node_type_is_ours_or_a_known_core_node(name, defs):
    for node in load(ui_path(name))["nodes"]:
        assert node["type"] in defs or node["type"] in VIRTUAL_NODES, node["type"]
    for entry in load(api_path(name)).values():
        assert entry["class_type"] in defs, entry["class_type"]


@pytest.mark.parametrize("name", TEMPLATES)
def test_widget_values_match_todays_input_types_in_order(name, defs):
    problems = []
    for node in load(ui_path(name))["nodes"]:
        if node["type"] in VIRTUAL_NODES:
            values = node.get("widgets_values") or []
            if len(values) != len(VIRTUAL_NODES[node["type"]]) or not all(isinstance(v, str) for v in values):
                problems.append(f"{node['type']}: {values!r}")
            continue
        problems += widget_problems(defs[node["type"]], node.get("widgets_values") or [], exact=True)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("name", TEMPLATES)
def test_links_join_outputs_and_inputs_of_the_declared_types(name, defs):
    ui = load(ui_path(name))
    nodes = {n["id"]: n for n in ui["nodes"]}
    for _, src, src_slot, dst, dst_slot, kind in ui["links"]:
        out_def, in_def = defs[nodes[src]["type"]], defs[nodes[dst]["type"]]
        assert out_def.outputs[src_slot] == kind, f"{out_def.type} output {src_slot} is {out_def.outputs[src_slot]}"
        assert nodes[src]["outputs"][src_slot]["name"] in (
            [o.name for o in out_def.cls.outputs] if out_def.cls else
            CORE_NODES[out_def.type].get("output_names", out_def.outputs))
        in_name = nodes[dst]["inputs"][dst_slot]["name"]
        spec = in_def.input_spec(in_name)
        assert spec is not None, f"{in_def.type} has no input {in_name}"
        assert spec[0] == kind, f"{in_def.type}.{in_name} takes {spec[0]}, linked {kind}"


@pytest.mark.parametrize("name", TEMPLATES)
def test_api_twin_is_exactly_the_ui_workflow_converted(name, defs):
    assert load(api_path(name)) == ui_to_api(load(ui_path(name)), defs)


@pytest.mark.parametrize("name", TEMPLATES)
def test_api_twin_has_every_required_input_with_a_valid_value(name, defs):
    problems = []
    for node_id, entry in load(api_path(name)).items():
        problems += api_input_problems(defs[entry["class_type"]], entry["inputs"])
        for value in entry["inputs"].values():
            if isinstance(value, list):
                assert value[0] in load(api_path(name)), f"{node_id} links to missing node {value[0]}"
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("name", TEMPLATES)
def test_each_template_ends_in_save_video_fed_by_generate_video(name):
    api = load(api_path(name))
    saves = [e for e in api.values() if e["class_type"] == "SaveVideo"]
    assert len(saves) == 1
    src = api[saves[0]["inputs"]["video"][0]]
    assert src["class_type"] in JOB_NODES and saves[0]["inputs"]["video"][1] == 2  # VIDEO output


@pytest.mark.parametrize("name", TEMPLATES)
def test_each_template_has_a_note_saying_what_it_needs(name):
    notes = nodes_of(load(ui_path(name)), "Note")
    assert len(notes) == 1
    text = notes[0]["widgets_values"][0]
    assert "GPU" in text
    if name != "remote_server":
        assert re.search(r"\d+ GB or more", text), "GPU memory"
        assert re.search(r"download.*about \d+ GB", text, re.S), "model download size"
    else:
        assert "API key" in text and "never in the workflow" in text


@pytest.mark.parametrize("name", TEMPLATES)
def test_no_absolute_paths_secrets_or_device_names(name):
    for path in (ui_path(name), api_path(name)):
        for text in strings_in(load(path)):
            assert not re.search(r"(^|[\s'\"=])(/(home|root|tmp|usr|opt|mnt|data|work)/|~/|[A-Za-z]:\\)", text), text
            assert not re.search(r"cuda:\d|CUDA_VISIBLE_DEVICES|\bH[12]00\b|\bA100\b|RTX|GeForce", text), text
            assert not re.search(r"\b(sk-[A-Za-z0-9]{8,}|hf_[A-Za-z0-9]{8,})|api_key\s*[:=]|Bearer ", text), text


def test_number_widgets_can_be_set_to_the_values_the_wan_rules_ask_for(defs):
    # ComfyUI's front end (1.27) snaps an edited INT widget to min + k*step: a step of 4 on
    # frames (min 0) made 81 impossible to type. Every valid Wan2.2 value must be on the grid.
    gen = defs["VLLMOmniGenerateVideo"]
    wanted = {"frames": [5, 81, 121], "width": [832, 1280, 480, 704], "height": [480, 704, 832, 1280],
              "steps": [4, 40, 50]}
    for name, values in wanted.items():
        _, opts = gen.input_spec(name)
        step, low = opts.get("step", 1), opts.get("min", 0)
        for value in values:
            assert (value - low) % step == 0 and low <= value <= opts["max"], (name, value, opts)


# --------------------------------------------------------------------------- released copies
RELEASED_UI = sorted(p.name for p in RELEASED.glob("*.json") if not p.name.endswith(".api.json"))
RELEASED_API = sorted(p.name for p in RELEASED.glob("*.api.json"))


def test_every_shipped_template_has_a_frozen_released_copy():
    # At each release, `python tests/comfyui/make_workflows.py --freeze` copies the templates here.
    assert {f"{n}.json" for n in TEMPLATES} <= set(RELEASED_UI)
    assert {f"{n}.api.json" for n in TEMPLATES} <= set(RELEASED_API)


@pytest.mark.parametrize("filename", RELEASED_UI)
def test_released_ui_workflow_still_loads_with_todays_nodes(filename, defs):
    ui = load(RELEASED / filename)
    problems = []
    nodes = {n["id"]: n for n in ui["nodes"]}
    for node in ui["nodes"]:
        if node["type"] in VIRTUAL_NODES:
            continue
        if node["type"] not in defs:
            problems.append(f"node type {node['type']} is gone")
            continue
        problems += widget_problems(defs[node["type"]], node.get("widgets_values") or [], exact=False)
    for _, src, src_slot, dst, dst_slot, kind in ui["links"]:
        out_def, in_def = defs[nodes[src]["type"]], defs[nodes[dst]["type"]]
        if src_slot >= len(out_def.outputs) or out_def.outputs[src_slot] != kind:
            problems.append(f"{out_def.type} output {src_slot} is no longer {kind}")
        spec = in_def.input_spec(nodes[dst]["inputs"][dst_slot]["name"])
        if spec is None or spec[0] != kind:
            problems.append(f"{in_def.type} input {nodes[dst]['inputs'][dst_slot]['name']} no longer takes {kind}")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("filename", RELEASED_API)
def test_released_api_workflow_still_validates_with_todays_nodes(filename, defs):
    problems = []
    for entry in load(RELEASED / filename).values():
        if entry["class_type"] not in defs:
            problems.append(f"node type {entry['class_type']} is gone")
            continue
        # a new *required* input breaks every saved API prompt: new inputs must be optional
        problems += api_input_problems(defs[entry["class_type"]], entry["inputs"])
    assert not problems, "\n".join(problems)


def test_the_positional_check_rejects_reordered_inserted_and_retyped_widgets(defs):
    node = nodes_of(load(ui_path("wan22_t2v_a14b_2gpu_ulysses")), "VLLMOmniServingConfig")[0]
    nd = defs["VLLMOmniServingConfig"]
    values = node["widgets_values"]
    assert widget_problems(nd, values, exact=True) == []
    swapped = values[:1] + [values[2], values[1]] + values[3:]             # parallel_mode <-> parallel_degree
    assert widget_problems(nd, swapped, exact=False)
    inserted = copy.deepcopy(nd)
    inserted.widgets.insert(1, Widget("new_flag", ("BOOLEAN", {})))     # a widget added in the middle
    assert widget_problems(inserted, values, exact=False)
    gen = defs["VLLMOmniGenerateVideo"]
    gen_values = nodes_of(load(ui_path("wan22_t2v_a14b_2gpu_ulysses")), "VLLMOmniGenerateVideo")[0]["widgets_values"]
    assert widget_problems(gen, gen_values[:-1] + ["sometimes"], exact=True)  # bad control_after_generate
    assert widget_problems(gen, gen_values[:-2], exact=True)                  # seed control missing


def test_image_templates_reference_comfyuis_shipped_example_image(defs):
    for name in ("wan22_ti2v_5b_image_to_video", "wan22_i2v_a14b_2gpu_cfg"):
        load_image = nodes_of(load(ui_path(name)), "LoadImage")
        assert [n["widgets_values"] for n in load_image] == [["example.png", "image"]]


def test_the_seed_sweep_is_one_prompt_several_seeds_and_a_save_for_every_clip():
    """workflows/wan22_ti2v_5b_seed_sweep.json: one prompt made batch_count times by Generate Batch with
    seeds seed .. seed+N-1, every clip saved, and its Note says its seeds."""
    name = "wan22_ti2v_5b_seed_sweep"
    ui, api = load(ui_path(name)), load(api_path(name))
    (batch,) = nodes_of(ui, "VLLMOmniGenerateBatch")
    values = widgets_by_name(node_defs()["VLLMOmniGenerateBatch"], batch)
    assert len(prompt_lines(values["prompts"])) == 1 and values["batch_count"] >= 2
    assert values["control_after_generate"] == "fixed"          # the sweep repeats until the user moves it
    seeds = [seed for _, seed in clip_plan(values["prompts"], values["seed"], values["batch_count"],
                                           LocalConfig().max_batch_clips)]
    assert seeds == list(range(values["seed"], values["seed"] + values["batch_count"]))
    note = nodes_of(ui, "Note")[0]["widgets_values"][0]
    said = re.search(r"one prompt as (\d+) clips", note) and re.search(r"\((\d+) to (\d+) here", note)
    assert said and int(re.search(r"(\d+) clips", note)[1]) == len(seeds)
    assert [int(said[1]), int(said[2])] == [seeds[0], seeds[-1]]
    (save,) = [e for e in api.values() if e["class_type"] == "SaveVideo"]
    source = api[save["inputs"]["video"][0]]
    assert source["class_type"] == "VLLMOmniGenerateBatch"
    assert node_defs()["VLLMOmniGenerateBatch"].cls.outputs[save["inputs"]["video"][1]].is_list   # once per clip
    assert save["inputs"]["filename_prefix"].startswith("video/")
