"""What the queued prompt says of a Local Server's jobs before any exists: how many, and whether CFG runs.

Local Server reads ComfyUI's hidden PROMPT (the API-format graph) to plan for the Generate nodes its
output feeds: a Generate Batch of two or more clips is where replicas would run whole jobs side by
side, and jobs at guidance 1 leave a CFG-parallel GPU idle. Separate Generate nodes do not add up:
ComfyUI runs them one after another. Pure functions of the prompt, so they are tested without ComfyUI.
"""
from __future__ import annotations

from typing import Any, Optional

from ..models import WanFamily, guidance_as_sent
from .speed_costs import cfg_runs


def prompt_lines(text: str) -> list[str]:
    """One prompt per line; blank lines are ignored, surrounding spaces dropped."""
    return [line.strip() for line in (text or "").splitlines() if line.strip()]


def queued_clips(inputs: dict[str, Any]) -> int:
    """The jobs a Generate node with these (queued, API format) inputs submits at once: prompt lines x
    batch_count for Generate Batch, 1 for Generate Video; a linked (not yet known) value counts as 1."""
    if "prompts" not in inputs:
        return 1
    prompts, count = inputs["prompts"], inputs.get("batch_count", 1)
    lines = len(prompt_lines(prompts)) if isinstance(prompts, str) else 1
    clips = int(count) if isinstance(count, int) and not isinstance(count, bool) else 1
    return max(1, lines) * max(1, clips)


def fed_jobs(prompt: Optional[dict[str, Any]], node_id: Optional[str]) -> list[dict[str, Any]]:
    """The inputs of the Generate nodes (Video and Batch) this Local Server's output feeds in the
    queued prompt: what the plan can know of its jobs before any exists."""
    if not prompt or node_id is None:
        return []
    return [n["inputs"] for n in prompt.values() if isinstance(n, dict) and isinstance(n.get("inputs"), dict)
            and "guidance" in n["inputs"] and [str(node_id), 0] in n["inputs"].values()]


def queued_jobs(prompt: Optional[dict[str, Any]], node_id: Optional[str]) -> int:
    """The most jobs one node this Local Server feeds submits at once: a Generate Batch's prompt
    lines x batch_count, 1 for Generate Video or no node."""
    return max(map(queued_clips, fed_jobs(prompt, node_id)), default=1)


def jobs_run_cfg(prompt: Optional[dict[str, Any]], node_id: Optional[str], family: WanFamily) -> bool:
    """Whether the jobs queued on this Local Server run CFG (`cfg_runs`), from the guidance widgets
    of the nodes its output feeds (`fed_jobs`), filled in as their requests will be for `family`.
    True where any may (a linked value, no such node): the server's default guidance is not 1."""
    jobs = fed_jobs(prompt, node_id)
    if not jobs:
        return True
    for inputs in jobs:
        values = (inputs["guidance"], inputs.get("guidance_2", -1.0))
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            return True             # linked from another node: known only when the job runs
        if cfg_runs(*guidance_as_sent(family, *values)):     # no media needed (VACE, S2V)
            return True
    return False
