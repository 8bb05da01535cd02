"""What Local Server reads of its jobs from the queued prompt before any exists (planner/queued_prompt.py):
a node's clip count (prompt lines x batch_count), the largest count among the nodes it feeds (not their
sum: ComfyUI runs them one after another), and whether any of them runs CFG at the guidance its request
will carry. Values linked from other nodes are unknown until the job runs and count as the safe side."""
from __future__ import annotations

import pytest

from queued_prompts import JOB, batch_node, queued_prompt, video_node
from vllm_omni_launcher.models import FAMILIES
from vllm_omni_launcher.planner.queued_prompt import jobs_run_cfg, prompt_lines, queued_clips, queued_jobs

A14B = FAMILIES["t2v_a14b"]


def test_prompt_lines_ignore_blank_lines_and_spaces():
    assert prompt_lines("a fox\n\n   \n  a cat in rain  \r\nowl\n") == ["a fox", "a cat in rain", "owl"]


@pytest.mark.parametrize("inputs, clips", [
    ({"prompts": "a fox\n\n a cat \n", "batch_count": 3}, 6),     # blank lines do not count
    ({"prompts": "a fox", "batch_count": 1}, 1),
    ({"prompts": ["7", 0], "batch_count": 4}, 4),                 # linked prompts: known when it runs
    ({"prompts": "a\nb", "batch_count": ["8", 0]}, 2),            # linked count
    ({"prompts": "", "batch_count": 2}, 2),                       # refused when it runs; counts as one line
    ({"prompt": "a cat"}, 1),                                     # Generate Video
])
def test_a_nodes_queued_clips_are_its_prompt_lines_times_batch_count(inputs, clips):
    assert queued_clips({**JOB, **inputs}) == clips


def test_local_server_counts_the_largest_batch_it_feeds_not_the_sum_of_its_nodes():
    prompt = queued_prompt(**{"10": batch_node("a fox\na cat", 3), "11": video_node(), "12": batch_node("owl", 2),
                              "20": batch_node("x\ny\nz", 8, server=("30", 0))})      # fed by another server
    # ComfyUI runs nodes one after another: only one node's jobs are on the server at a time
    assert queued_jobs(prompt, "3") == 6
    assert queued_jobs(queued_prompt(**{"11": video_node()}), "3") == 1
    assert queued_jobs(None, "3") == 1 and queued_jobs(prompt, None) == 1


@pytest.mark.parametrize("jobs, runs", [
    ([{"guidance": 1.0, "guidance_2": 1.0}], False),                       # the distill template's values
    ([{"guidance": 1.0, "guidance_2": -1.0}], True),                       # low-noise expert: the model's 3.0
    ([{"guidance": -1.0, "guidance_2": -1.0}], True),                      # the model's recommended CFG
    ([{"guidance": 1.0, "guidance_2": 1.0}, {"guidance": 4.0, "guidance_2": 3.0}], True),   # one job needs CFG
    ([{"guidance": ["20", 0], "guidance_2": 1.0}], True),                  # linked: unknown until it runs
    ([], True),                                                            # no job node: the server default
])
def test_local_server_plans_for_the_guidance_of_the_generate_nodes_it_feeds(jobs, runs):
    status = {"class_type": "VLLMOmniServerStatus", "inputs": {"server": ["3", 0]}}   # feeds no job
    prompt = queued_prompt(**{"9": status}, **{str(10 + i): video_node(**job) for i, job in enumerate(jobs)})
    assert jobs_run_cfg(prompt, "3", A14B) is runs
    assert jobs_run_cfg(None, "3", A14B) is True
