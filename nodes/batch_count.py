"""How many clips a Generate Batch node makes: its prompt lines times its batch_count.

Shared by the node itself (batch_session.clip_plan) and by Local Server, which reads the queued
prompt before any job exists: a batch's jobs are all submitted at once, so a server fed by a batch
of two or more clips is one where replicas would run several whole jobs side by side, and the
planner says so. Separate Generate nodes do not add up: ComfyUI runs them one after another, so
each keeps at most one job on the server at a time.
"""
from __future__ import annotations

from typing import Any


def prompt_lines(text: str) -> list[str]:
    """One prompt per line; blank lines are ignored, surrounding spaces dropped."""
    return [line.strip() for line in (text or "").splitlines() if line.strip()]


def queued_clips(inputs: dict[str, Any]) -> int:
    """The jobs a Generate node with these inputs (a queued prompt's, API format) submits at once:
    prompt lines x batch_count for Generate Batch, 1 for Generate Video. A linked (not yet known)
    prompts or batch_count counts as 1."""
    if "prompts" not in inputs:
        return 1
    prompts, count = inputs["prompts"], inputs.get("batch_count", 1)
    lines = len(prompt_lines(prompts)) if isinstance(prompts, str) else 1
    clips = int(count) if isinstance(count, int) and not isinstance(count, bool) else 1
    return max(1, lines) * max(1, clips)
