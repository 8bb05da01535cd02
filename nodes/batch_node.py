"""Generate Batch: several prompts (one per line) and/or several seeds in one go, all clips back.

Its inputs are Generate Video's declarations (taken from that node, not copied), with the
one `prompt` replaced by `prompts` and `batch_count` added after `seed`. The seed sweep is
ComfyUI's usual form (EmptyLatentImage's batch_size, KSampler's seed): one `seed` widget and
a count, clip j of each prompt getting seed + j, so "control after generate" still moves the
whole sweep and a workflow never holds a list of numbers to keep in step with the count.
"""
from __future__ import annotations

from typing import Any, Optional

from ..client.request import DEFAULT_SAMPLER
from . import batch_session
from .generate_node import NO_MODEL, GenerateVideo, interpolation_for
from .handles import ServerHandle

MAX_BATCH_WIDGET = 64    # the widget's own range; the machine's cap is the local config's max_batch_clips


def batch_input_types() -> dict[str, Any]:
    """Generate Video's inputs with `prompts` in place of `prompt` and `batch_count` after `seed`."""
    base = GenerateVideo.INPUT_TYPES()
    required: dict[str, Any] = {}
    for name, spec in base["required"].items():
        if name == "prompt":
            required["prompts"] = ("STRING", {
                "multiline": True, "default": "",
                "tooltip": "one prompt per line (blank lines are ignored); every line is made batch_count "
                           "times, with seeds seed, seed+1, ..."})
            continue
        required[name] = spec
        if name == "seed":
            required["batch_count"] = ("INT", {
                "default": 1, "min": 1, "max": MAX_BATCH_WIDGET,
                "tooltip": "clips per prompt line, with seeds seed .. seed+batch_count-1; prompt lines x "
                           "batch_count may be at most the local config's max_batch_clips"})
    return {"required": required, "optional": base["optional"], "hidden": base["hidden"]}


class GenerateBatch:
    """Run several Wan2.2 jobs at once on the server and return all their clips."""

    DESCRIPTION = ("Several clips in one go: one prompt per line and/or batch_count seeds per prompt "
                   "(seed, seed+1, ...); all other widgets as in Generate Video. All jobs are sent at once, so a "
                   "server with request batching (vLLM-Omni 0.30, --max-num-seqs) or replicas runs them "
                   "together. Returns every clip's frames as one IMAGE batch (in order), each clip's VIDEO (a "
                   "list: Save Video saves each) and a summary. One progress bar over all clips; Cancel deletes "
                   "every job. The local config's max_batch_clips caps the number of clips.")
    CATEGORY = GenerateVideo.CATEGORY
    RETURN_TYPES = ("IMAGE", "FLOAT", "VIDEO", "STRING")
    RETURN_NAMES = ("frames", "fps", "videos", "summary")
    OUTPUT_IS_LIST = (False, False, True, False)
    OUTPUT_TOOLTIPS = ("the frames of all clips, one after the other in prompt then seed order, IMAGE "
                       "[clips x frames, height, width, 3] float32 0..1",
                       "the clips' frame rate, for nodes that take IMAGE + fps (e.g. Create Video)",
                       "each clip's MP4 as ComfyUI VIDEO, not re-encoded (a list: a Save Video node runs once "
                       "per clip)",
                       "which clip is which (prompt and seed), their size, and how the server ran them")
    FUNCTION = "generate"

    @classmethod
    def INPUT_TYPES(cls):  # noqa: N802
        return batch_input_types()

    def generate(self, server: ServerHandle, prompts: str, negative_prompt: str, width: int, height: int,
                 frames: int, fps: float, steps: int, guidance: float, guidance_2: float, boundary_ratio: float,
                 flow_shift: float, seed: int, batch_count: int, sampler: str = DEFAULT_SAMPLER,
                 frame_interpolation: str = "off", interpolation_model: str = NO_MODEL, image: Any = None,
                 unique_id: Optional[str] = None):
        return batch_session.generate_batch(
            server, prompts=prompts, seed=seed, batch_count=batch_count, image=image, node_id=unique_id,
            sampler=sampler, interpolation=interpolation_for(frame_interpolation, interpolation_model),
            negative_prompt=negative_prompt, width=width, height=height, frames=frames, fps=fps, steps=steps,
            guidance=guidance, guidance_2=guidance_2, boundary_ratio=boundary_ratio, flow_shift=flow_shift)
