"""How many clips a Generate Batch node makes: its prompt lines times its batch_count.

Shared by the node (batch_session.clip_plan) and Local Server, which reads the queued prompt before
any job exists: a batch of two or more clips is where replicas would run whole jobs side by side.
Separate Generate nodes do not add up: ComfyUI runs them one after another.
"""
from __future__ import annotations

from typing import Any


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
