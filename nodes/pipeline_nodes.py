"""VACE, speech-to-video and FastWan nodes: ComfyUI's own IMAGE and AUDIO in, frames out (docs/wan-pipelines.md).

Load Wan Pipeline Model picks one of models.PIPELINE_FAMILIES (a preset, or a local folder of one);
Local Server and Generate Video serve and run it as any model (FastWan needs nothing else). Generate
VACE Video takes the control video as an IMAGE batch (Load Video's frames) or reference images as an
IMAGE batch; Generate Speech-to-Video an IMAGE (the portrait) and an AUDIO (Load Audio). Their shapes are
checked against the request before anything is encoded (client/media.py bounds the rest), then one call
into session.generate_video. Masks are not an input: vLLM-Omni's HTTP route cannot carry one.
"""
from __future__ import annotations

from typing import Any, Optional

from ..client import media
from ..errors import LauncherError
from ..models import PIPELINE_FAMILIES, LocalModel, find_local_models, nearest_frames
from . import comfy_bridge, session
from .generate_node import MINUS_ONE, VIDEO_OUTPUTS, ZERO, text_input
from .handles import MODEL_TYPE, SERVER_TYPE, ModelChoice, ServerHandle
from .model_nodes import choose_entry
from .schema import Input, Node, Output

PRESETS = {f.hf_id: f for f in PIPELINE_FAMILIES.values()}


def _local_models() -> dict[str, LocalModel]:
    return {label: local for label, local in find_local_models(comfy_bridge.diffusers_folders(), pipelines=True)
            .items() if local.family.key in PIPELINE_FAMILIES}


def choose_pipeline_model(name: str) -> ModelChoice:
    """A Load Wan Pipeline Model entry as the server will be started with it (list entries only, as
    Load Model: a workflow can neither open nor probe other paths)."""
    return choose_entry(name, PRESETS, _local_models, "Load Wan Pipeline Model", (
        "it takes a VACE, S2V or FastWan preset (the server downloads it) or a local/... folder of one "
        "found under ComfyUI's models/diffusers folders; it never opens other paths"), "the folder")


def _family(server: ServerHandle, pipeline: str, node: str) -> Any:
    family = server.family
    if family.pipeline != pipeline:
        wanted = {"vace": "Wan2.1 VACE-14B or VACE-1.3B", "s2v": "Wan2.2 S2V-14B"}[pipeline]
        takes = "a control video or reference images" if pipeline == "vace" else "audio"
        raise LauncherError(f"{node} needs a {wanted} server; this one serves {family.label}",
                            f"only that model takes {takes}",
                            f"load {wanted} with Load Wan Pipeline Model into the Local Server that feeds '{node}' "
                            "(for a Remote Server: its model_family)", setting="server")
    return family


def _vace(server: ServerHandle, prompt: str, negative_prompt: str, width: int, height: int, frames: int,
          steps: int, guidance: float, seed: int, control_video: Any = None, reference_images: Any = None,
          unique_id: Optional[str] = None) -> tuple:
    family = _family(server, "vace", "Generate VACE Video")
    if control_video is not None and reference_images is not None:     # before either is encoded
        raise LauncherError("Generate VACE Video has both control_video and reference_images",
                            "vLLM-Omni takes one image or one video per request for Wan (it answers 400 'does not "
                            "support mixed image and video references')",
                            "disconnect reference_images or control_video", setting="reference_images")
    control = None
    if control_video is not None:
        count, got_h, got_w = (int(n) for n in control_video.shape[:3])
        width, height = width or got_w, height or got_h              # 0: the control video's own
        frames = frames or (count if nearest_frames(count) == count else frames)
        media.check_control_fits(count, got_w, got_h, frames=frames or family.frames, width=width, height=height)
        control = media.control_video_from_frames(control_video, fps=family.fps)
    refs: tuple = ()
    if reference_images is not None:          # built at the request's size, so it is fixed here
        width, height = width or family.width, height or family.height
        refs = media.reference_images_from_batch(reference_images, width, height)
    return session.generate_video(server, node_id=unique_id, prompt=prompt, negative_prompt=negative_prompt,
                                  width=width, height=height, frames=frames, fps=0, steps=steps, guidance=guidance,
                                  seed=seed, control_video=control, reference_images=refs)


def _s2v(server: ServerHandle, prompt: str, negative_prompt: str, image: Any, audio: Any, width: int, height: int,
         frames: int, steps: int, guidance: float, seed: int, unique_id: Optional[str] = None) -> tuple:
    _family(server, "s2v", "Generate Speech-to-Video")
    clip = media.audio_clip(audio["waveform"], audio["sample_rate"])     # an AUDIO: schema.py checked its form
    return session.generate_video(server, image=image, node_id=unique_id, prompt=prompt,
                                  negative_prompt=negative_prompt, width=width, height=height, frames=frames, fps=0,
                                  steps=steps, guidance=guidance, seed=seed, audio=clip)


def _size(name: str) -> Input:
    return Input(name, "INT", "multiple of 16; " + ZERO, default=0, opts={"min": 0, "max": 1280, "step": 16})


def _common(frames_tooltip: str, frames_max: int) -> list[Input]:
    return [
        _size("width"), _size("height"),
        Input("frames", "INT", frames_tooltip, default=0, opts={"min": 0, "max": frames_max}),
        Input("steps", "INT", "denoise steps (VACE 50, S2V 40); " + ZERO, default=0, opts={"min": 0, "max": 200}),
        Input("guidance", "FLOAT", "CFG scale; 1 = no CFG; " + MINUS_ONE, default=-1.0,
              opts={"min": -1.0, "max": 20.0, "step": 0.1}),
        Input("seed", "INT", "noise seed: the same seed and settings give the same video", default=0,
              opts={"min": 0, "max": 2**63 - 1, "control_after_generate": True}),
    ]


LOAD_PIPELINE_MODEL = Node(
    "VLLMOmniLoadPipelineModel", "vLLM-Omni Load Wan Pipeline Model",
    "A Wan pipeline beyond text/image-to-video for vLLM-Omni: VACE (a control video or reference images; "
    "Wan2.1 VACE-14B about 80 GB, 1.3B smaller), S2V-14B (a portrait and speech), FastWan2.2 TI2V-5B (3 steps, "
    "vLLM-Omni 0.30). Presets are downloaded by the server on its first start; local/... entries are folders of "
    "these models under ComfyUI's models/diffusers folders. Memory estimates for these are not measured yet.",
    lambda: [Input("model", "COMBO", "a preset (Hugging Face id, downloaded on first start) or local/<path>",
                   default=PIPELINE_FAMILIES["vace_1_3b"].hf_id, own_choice=True, choose=choose_pipeline_model,
                   options=lambda: [*PRESETS, *sorted(_local_models())])],
    (Output(MODEL_TYPE, "model", "the model to serve: connect to Local Server"),),
    lambda model: (choose_pipeline_model(model),), hidden=())

GENERATE_VACE = Node(
    "VLLMOmniGenerateVACE", "vLLM-Omni Generate VACE Video",
    "VACE on a vLLM-Omni server: text to video that follows a control video (depth, pose, edges or a source "
    "clip: an IMAGE batch, e.g. Load Video's frames, exactly width x height and frames long; 0 takes its size "
    "and length) or shows 1-4 reference images (an IMAGE batch; more than one needs vLLM-Omni 0.30). Not both: "
    "the server refuses that. Masks and first/last frames are not possible over vLLM-Omni's HTTP API.",
    lambda: [Input("server", SERVER_TYPE, "a Local Server running Wan2.1 VACE"),
             text_input("prompt", "what the video shows (required)"),
             text_input("negative_prompt", "what to avoid (empty = none)"),
             *_common("4k+1 frames; " + ZERO + " (the control video's length, else 81)", 257),
             Input("control_video", "IMAGE", "frames the video follows: [frames, height, width, 3]", optional=True),
             Input("reference_images", "IMAGE", "1-4 images whose subject or style the video shows", optional=True)],
    VIDEO_OUTPUTS, _vace)

GENERATE_S2V = Node(
    "VLLMOmniGenerateSpeechToVideo", "vLLM-Omni Generate Speech-to-Video",
    "Wan2.2 S2V-14B on a vLLM-Omni server: the person in 'image' speaks or sings 'audio' (up to 20 s; Load "
    "Audio). The clip is as long as the audio at 16 fps, made of parts of 'frames' frames each (0 = 80), with "
    "the audio muxed into the server's MP4. Width and height must be multiples of 16 (0 = 832x448).",
    lambda: [Input("server", SERVER_TYPE, "a Local Server running Wan2.2 S2V-14B"),
             text_input("prompt", "what the scene shows, e.g. a woman singing on a stage (required)"),
             text_input("negative_prompt", "what to avoid (empty = the model's own)"),
             Input("image", "IMAGE", "the face or portrait to animate (first image of a batch)"),
             Input("audio", "AUDIO", "the speech or song, at most 20 s"),
             *_common("frames per part, a multiple of 4 up to 120; " + ZERO + " (80)", 120)],
    VIDEO_OUTPUTS, _s2v)
