"""The graph of one issue-30 pipeline run: our template from workflows/api/ as it ships, pointed at the bench's
model folder, at one shape, ending in the bench sink (graphs.sink: Get Image Size -> Preview Any, plus a 4-frame
PNG sample) instead of Save Video.

What changes per template, and only that: Load Wan Pipeline Model's model (`local/<pipeline>-fullsize`); the
job node's seed, prompt (a new text per take, so the text encoder runs again), steps (FastWan: left at 0, the
DMD model runs its own 3 and another value is refused); the shape: VACE through the template's own Image From
Batch (frames) and Upscale Image (width x height) on Load Video's 100-frame 1280x720 control clip (Generate VACE's
0 widgets take the control video's size and length), S2V and FastWan through the job node's width / height /
frames (S2V: frames per clip). The Serving Config stays the template's (optionally overridden with `serving`).
"""
from __future__ import annotations

import json
from typing import Any, Optional

from .common import REPO
from .graphs import sink, sample_frames
from .pipeline_families import Pipeline

JOB_NODES = ("VLLMOmniGenerateVACE", "VLLMOmniGenerateSpeechToVideo", "VLLMOmniGenerateVideo")
PROMPTS = {"vace": "A dancer in a flowing red dress spins on a wooden stage, warm spotlight, smooth motion",
           "s2v": "A woman sings on a small stage, gentle head movements, soft stage light",
           "dmd": "A red fox trotting through fresh snow in a birch forest at sunrise, soft golden light"}
S2V_DROPPED = 3     # frames the S2V pipeline drops from its first clip


def template(name: str) -> dict:
    return json.loads((REPO / "workflows" / "api" / f"{name}.api.json").read_text())


def node_of(prompt: dict, class_type: str) -> str:
    found = [k for k, e in prompt.items() if e["class_type"] == class_type]
    if len(found) != 1:
        raise ValueError(f"the template has {len(found)} {class_type} nodes, the bench expects one")
    return found[0]


def job_node(prompt: dict) -> str:
    return next(k for k, e in prompt.items() if e["class_type"] in JOB_NODES)


def kind(p: Pipeline) -> str:
    return {"vace_14b": "vace", "vace_1_3b": "vace", "s2v_14b": "s2v"}.get(p.family, "dmd")


def expected_frames(p: Pipeline, frames: int) -> int:
    """Frames the IMAGE output holds: S2V's one clip less the frames it drops; VACE / FastWan the request's."""
    return frames - S2V_DROPPED if kind(p) == "s2v" else frames


def pipeline_prompt(p: Pipeline, shape: tuple[int, int, int], steps: int, seed: int, take: int, prefix: str,
                    serving: Optional[dict] = None) -> dict:
    """Our template of `p` for one job at `shape`, ending in the sink and the PNG sample."""
    prompt = template(p.template)
    prompt[node_of(prompt, "VLLMOmniLoadPipelineModel")]["inputs"]["model"] = f"local/{p.folder}"
    prompt[node_of(prompt, "VLLMOmniServingConfig")]["inputs"].update(serving or {})
    gen = job_node(prompt)
    w, h, f = shape
    tag = "" if take == 1 else f", take {take}"
    inputs: dict[str, Any] = prompt[gen]["inputs"]
    inputs.update(prompt=PROMPTS[kind(p)] + tag, seed=seed + take)
    if kind(p) != "dmd":
        inputs["steps"] = steps
    if kind(p) == "vace":
        prompt[node_of(prompt, "ImageFromBatch")]["inputs"].update(batch_index=0, length=f)
        prompt[node_of(prompt, "ImageScale")]["inputs"].update(width=w, height=h)
    else:
        inputs.update(width=w, height=h, frames=f)
    for key in [k for k, e in prompt.items() if e["class_type"] in ("SaveVideo", "SaveImage")]:
        del prompt[key]
    sink(prompt, [gen, 0])
    return sample_frames(prompt, [gen, 0], prefix, expected_frames(p, f))
