"""The seed-sweep template (workflows/wan22_ti2v_5b_seed_sweep.json): one prompt made batch_count times
by Generate Batch with seeds seed .. seed+N-1, every clip saved. What every template must be is
tests/unit/test_workflows.py's; here: that this one is a seed sweep, and that its Note says its seeds."""
from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_workflows import api_path, load, node_defs, nodes_of, ui_path, widgets_by_name  # noqa: E402

from vllm_omni_launcher.nodes.batch_count import prompt_lines  # noqa: E402
from vllm_omni_launcher.nodes.batch_session import clip_plan  # noqa: E402
from vllm_omni_launcher.server.local_config import LocalConfig  # noqa: E402

NAME = "wan22_ti2v_5b_seed_sweep"


def test_the_seed_sweep_is_one_prompt_several_seeds_and_a_save_for_every_clip():
    ui, api = load(ui_path(NAME)), load(api_path(NAME))
    (batch,) = nodes_of(ui, "VLLMOmniGenerateBatch")
    values = widgets_by_name(node_defs()["VLLMOmniGenerateBatch"], batch)
    assert len(prompt_lines(values["prompts"])) == 1 and values["batch_count"] >= 2
    assert values["control_after_generate"] == "fixed"          # the sweep repeats until the user moves it
    seeds = [seed for _, seed in clip_plan(values["prompts"], values["seed"], values["batch_count"],
                                           LocalConfig().max_batch_clips)]
    assert seeds == list(range(values["seed"], values["seed"] + values["batch_count"]))
    note = nodes_of(ui, "Note")[0]["widgets_values"][0]
    said = re.search(r"(\d+) clips on one GPU", note) and re.search(r"\((\d+) to (\d+) here", note)
    assert said and int(re.search(r"(\d+) clips", note)[1]) == len(seeds)
    assert [int(said[1]), int(said[2])] == [seeds[0], seeds[-1]]
    (save,) = [e for e in api.values() if e["class_type"] == "SaveVideo"]
    source = api[save["inputs"]["video"][0]]
    assert source["class_type"] == "VLLMOmniGenerateBatch"
    assert node_defs()["VLLMOmniGenerateBatch"].cls.OUTPUT_IS_LIST[save["inputs"]["video"][1]]   # once per clip
    assert save["inputs"]["filename_prefix"].startswith("video/")
