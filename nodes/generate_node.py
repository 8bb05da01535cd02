"""Generate Video and Generate Batch: prompts (and an image) to IMAGE frames, fps and VIDEO.

Generate Batch's inputs are Generate Video's (`job_inputs`, not copied), with `prompts` in place of
`prompt` and `batch_count` after `seed`. Its seed sweep is ComfyUI's usual form (EmptyLatentImage's
batch_size, KSampler's seed): one `seed` and a count, clip j of each prompt getting seed + j, so
"control after generate" moves the whole sweep and a workflow never holds a list of seeds.
"""
from __future__ import annotations

from typing import Any

from ..client.request import DEFAULT_SAMPLER, SAMPLERS
from ..models import FAMILIES, REQUEST_FIELDS as FIELDS, WanFamily
from . import batch_session, comfy_bridge, session
from .handles import SERVER_TYPE
from .schema import Input, Node, Output
from .session import INTERPOLATION, NO_MODEL

ZERO = "0 = the model's recommended value"
MINUS_ONE = "-1 = the model's recommended value"
# The base families as the texts name them: the A14B pair shares the values shown (a test checks it).
A14B, TI2V_5B = FAMILIES["t2v_a14b"], FAMILIES["ti2v_5b"]


def _by_model(attr: str) -> str:
    """'40 A14B, 50 TI2V-5B': a family default as the tooltips say it, read from models/families.py."""
    return f"{getattr(A14B, attr):g} A14B, {getattr(TI2V_5B, attr):g} TI2V-5B"


def _shape_of(family: WanFamily) -> str:
    """'832x480, 81 frames at 16 fps': a family's default clip."""
    return f"{family.width}x{family.height}, {family.frames} frames at {family.fps:g} fps"


_SIZE_TIP = f"multiple of {A14B.size_multiple} (A14B) or {TI2V_5B.size_multiple} (TI2V-5B); " + ZERO


def _number(name: str, kind: str, default: Any, tooltip: str, **opts: Any) -> Input:
    return Input(name, kind, tooltip, default=default, opts=opts)


def text_input(name: str, tooltip: str) -> Input:
    return Input(name, "STRING", tooltip, default="", opts={"multiline": True})


def job_inputs(prompt: Input) -> list[Input]:
    """Generate Video's inputs, with `prompt` in its place (Generate Batch puts its `prompts` there)."""
    return [
        Input("server", SERVER_TYPE, "where the job runs: Local Server or Remote Server"),
        prompt,
        text_input("negative_prompt", "what to avoid, e.g. blurry, jitter, watermark (empty = none)"),
        _number("width", "INT", 0, _SIZE_TIP, **FIELDS["width"].widget(step=16)),
        _number("height", "INT", 0, _SIZE_TIP, **FIELDS["height"].widget(step=16)),
        # frames has no step: the UI snaps to min+k*step
        _number("frames", "INT", 0, f"4k+1 frames ({A14B.frames}, {TI2V_5B.frames}, ...); {ZERO}",
                **FIELDS["frames"].widget()),
        _number("fps", "FLOAT", 0.0, f"frame rate of the MP4 (Wan does not use it); {ZERO} ({_by_model('fps')})",
                **FIELDS["fps"].widget(step=1.0)),
        _number("steps", "INT", 0, f"denoise steps ({_by_model('steps')}); " + ZERO, **FIELDS["steps"].widget()),
        _number("guidance", "FLOAT", -1.0, "CFG scale (of the high-noise expert on A14B); 1 = no CFG; " + MINUS_ONE,
                **FIELDS["guidance"].widget(step=0.1)),
        _number("guidance_2", "FLOAT", -1.0, "CFG of the low-noise expert (A14B only); " + MINUS_ONE,
                **FIELDS["guidance_2"].widget(step=0.1)),
        _number("boundary_ratio", "FLOAT", -1.0, "A14B expert switch point; a server-side value wins; " + MINUS_ONE,
                **FIELDS["boundary_ratio"].widget(step=0.005)),
        _number("flow_shift", "FLOAT", -1.0, "scheduler flow shift; " + MINUS_ONE,
                **FIELDS["flow_shift"].widget(step=0.5)),
        _number("seed", "INT", 0, "noise seed: the same seed and settings give the same video; a new seed re-runs "
                "only this node", **FIELDS["seed"].widget(control_after_generate=True)),
        Input("image", "IMAGE", "start frame: required for I2V-A14B, optional for TI2V-5B, refused by T2V-A14B "
              "(first image of a batch)", optional=True),
        # Optional and after the original widgets: saved workflows store values by position,
        # and released API workflows (without them) must still validate.
        Input("sampler", "COMBO", "unipc (upstream's default) or euler (for 4-step distill LoRAs such as lightx2v)",
              default=DEFAULT_SAMPLER, optional=True, options=tuple(SAMPLERS)),
        Input("frame_interpolation", "COMBO", "RIFE after decoding: x2 / x4 the frames and the fps (frames become "
              "(F-1)*k+1); needs interpolation_model", default="off", optional=True, options=tuple(INTERPOLATION)),
        Input("interpolation_model", "COMBO", "a RIFE folder (flownet.pkl) under ComfyUI/models/frame_interpolation; "
              "local servers only", default=NO_MODEL, optional=True, own_choice=True,
              options=lambda: [NO_MODEL, *sorted(comfy_bridge.interpolation_models())]),
    ]


# Generate Video's outputs, which the pipeline nodes (pipeline_nodes.py) return too
VIDEO_OUTPUTS = (Output("IMAGE", "frames", "the decoded frames, IMAGE [frames, height, width, 3] float32 0..1"),
                 Output("FLOAT", "fps", "the video's frame rate, for nodes that take IMAGE + fps (e.g. Create Video)"),
                 Output("VIDEO", "video", "the server's MP4 as ComfyUI VIDEO, not re-encoded: connect to Save Video"))


GENERATE_VIDEO = Node(
    "VLLMOmniGenerateVideo", "vLLM-Omni Generate Video",
    "Text (and image) to video on a vLLM-Omni server. 0 (for sizes, frames, fps, steps) or -1 (for guidance, "
    f"boundary and shift) means the model's recommended value: A14B {_shape_of(A14B)}; TI2V-5B {_shape_of(TI2V_5B)}. "
    "When the serving plan fits less than that, widgets at 0 take the plan's size "
    "and frames (the node says so). Inputs are checked before anything is sent. A stopped local server is started "
    "again. Cancel deletes the job on the server.",
    lambda: job_inputs(text_input("prompt", "what the video shows and how the camera moves (required)")),
    VIDEO_OUTPUTS, lambda server, unique_id, **widgets: session.generate_video(server, node_id=unique_id, **widgets))

MAX_BATCH_WIDGET = 64    # the widget's own range; the machine's cap is the local config's max_batch_clips


def batch_inputs() -> list[Input]:
    """Generate Video's inputs with `prompts` in place of `prompt` and `batch_count` after `seed`."""
    inputs = job_inputs(text_input("prompts", "one prompt per line (blank lines are ignored); every line is made "
                              "batch_count times, with seeds seed, seed+1, ..."))
    after_seed = [i.name for i in inputs].index("seed") + 1
    inputs.insert(after_seed, Input("batch_count", "INT", "clips per prompt line, with seeds seed .. "
                                    "seed+batch_count-1; prompt lines x batch_count may be at most the local "
                                    "config's max_batch_clips", default=1, opts={"min": 1, "max": MAX_BATCH_WIDGET}))
    return inputs


GENERATE_BATCH = Node(
    "VLLMOmniGenerateBatch", "vLLM-Omni Generate Batch",
    "Several clips in one go: one prompt per line and/or batch_count seeds per prompt (seed, seed+1, ...); all "
    "other widgets as in Generate Video. All jobs are sent at once, so a server with request batching (vLLM-Omni "
    "0.30, --max-num-seqs) or replicas runs them together. Returns every clip's frames as one IMAGE batch (in "
    "order), each clip's VIDEO (a list: Save Video saves each) and a summary. One progress bar over all clips; "
    "Cancel deletes every job. The local config's max_batch_clips caps the number of clips.",
    batch_inputs,
    (Output("IMAGE", "frames", "the frames of all clips, one after the other in prompt then seed order, IMAGE "
            "[clips x frames, height, width, 3] float32 0..1"),
     Output("FLOAT", "fps", "the clips' frame rate, for nodes that take IMAGE + fps (e.g. Create Video)"),
     Output("VIDEO", "videos", "each clip's MP4 as ComfyUI VIDEO, not re-encoded (a list: a Save Video node runs "
            "once per clip)", is_list=True),
     Output("STRING", "summary", "which clip is which (prompt and seed), their size, and how the server ran them")),
    lambda server, unique_id, **widgets: batch_session.generate_batch(server, node_id=unique_id, **widgets))
