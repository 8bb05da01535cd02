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
from ..models import (PIPELINE_FAMILIES, REQUEST_FIELDS as FIELDS, S2V_FRAMES_PER_CLIP_MAX, LocalModel, check_inputs,
                      check_request, find_local_models, nearest_frames)
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
    check_inputs(family, [name for name, batch in (("control_video", control_video),     # before either is encoded
                                                   ("reference_images", reference_images)) if batch is not None])
    control = None
    if control_video is not None:
        count, got_h, got_w = (int(n) for n in control_video.shape[:3])
        _check_size(family, width, height, got_w, got_h)
        width, height = width or got_w, height or got_h              # 0: the control video's own
        frames = frames or (count if nearest_frames(count) == count else frames)
        media.check_control_fits(count, got_w, got_h, frames=frames or family.frames, width=width, height=height)
        control = media.control_video_from_frames(control_video, fps=family.fps)
    # the reference images go as given: models.request_for makes them at the size it resolves
    return session.generate_video(server, node_id=unique_id, prompt=prompt, negative_prompt=negative_prompt,
                                  width=width, height=height, frames=frames, fps=0, steps=steps, guidance=guidance,
                                  seed=seed, control_video=control, reference_images=reference_images)


def _check_size(family: Any, width: int, height: int, got_w: int, got_h: int) -> None:
    """The request's width and height (0: the control video's) by the model's own rule (check_request),
    before the control video is encoded: an odd size would otherwise reach the H.264 encoder and fail
    there. A size taken from the video is refused as the video's, so the fix names what to resize."""
    try:
        check_request(family, width=width or got_w, height=height or got_h, frames=family.frames, has_image=False)
    except LauncherError as exc:
        if {"width": width, "height": height}.get(exc.setting or "") != 0:
            raise                           # a widget's own value: check_request's words name the widget
        raise LauncherError(
            f"The control video is {got_w}x{got_h}: its {exc.what}",
            f"{exc.setting} is 0, so the request takes the control video's {exc.setting}; {exc.why}",
            f"resize the control video (e.g. with ComfyUI's Upscale Image node) so that its width and height are "
            f"multiples of {family.size_multiple} (width and height 0 then take its size), or {exc.fix} and resize "
            "the video to match", setting="control_video") from None


def _s2v(server: ServerHandle, prompt: str, negative_prompt: str, image: Any, audio: Any, width: int, height: int,
         frames: int, steps: int, guidance: float, seed: int, unique_id: Optional[str] = None) -> tuple:
    _family(server, "s2v", "Generate Speech-to-Video")
    clip = media.audio_clip(audio["waveform"], audio["sample_rate"])     # an AUDIO: schema.py checked its form
    return session.generate_video(server, image=image, node_id=unique_id, prompt=prompt,
                                  negative_prompt=negative_prompt, width=width, height=height, frames=frames, fps=0,
                                  steps=steps, guidance=guidance, seed=seed, audio=clip)


# The pipeline families as the texts name them: the two VACE sizes share the values shown (a test checks it).
VACE, S2V = PIPELINE_FAMILIES["vace_14b"], PIPELINE_FAMILIES["s2v_14b"]
# Width and height stop at 1280 here (the request range allows 4096): Wan is trained at up to 1280x720
# (media.MAX_CONTROL_PIXELS bounds a control frame to it), and VACE and S2V are not run larger.
PIPELINE_SIZE_MAX = 1280


def _size(name: str) -> Input:
    return Input(name, "INT", f"multiple of {VACE.size_multiple}; " + ZERO, default=0,
                 opts=FIELDS[name].widget(PIPELINE_SIZE_MAX, step=VACE.size_multiple))


def _common(frames_tooltip: str, frames_max: int) -> list[Input]:
    return [
        _size("width"), _size("height"),
        Input("frames", "INT", frames_tooltip, default=0, opts=FIELDS["frames"].widget(frames_max)),
        Input("steps", "INT", f"denoise steps (VACE {VACE.steps}, S2V {S2V.steps}); " + ZERO, default=0,
              opts=FIELDS["steps"].widget()),
        Input("guidance", "FLOAT", "CFG scale; 1 = no CFG; " + MINUS_ONE, default=-1.0,
              opts=FIELDS["guidance"].widget(step=0.1)),
        Input("seed", "INT", "noise seed: the same seed and settings give the same video", default=0,
              opts=FIELDS["seed"].widget(control_after_generate=True)),
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
    f"and length) or shows 1-{media.MAX_REFERENCE_IMAGES} reference images (an IMAGE batch; more than one needs "
    "vLLM-Omni 0.30). Not both: the server refuses that. Masks and first/last frames are not possible over "
    "vLLM-Omni's HTTP API.",
    lambda: [Input("server", SERVER_TYPE, "a Local Server running Wan2.1 VACE"),
             text_input("prompt", "what the video shows (required)"),
             text_input("negative_prompt", "what to avoid (empty = none)"),
             *_common(f"4k+1 frames; {ZERO} (the control video's length, else {VACE.frames})",
                      media.MAX_CONTROL_FRAMES),
             Input("control_video", "IMAGE", "frames the video follows: [frames, height, width, 3]", optional=True),
             Input("reference_images", "IMAGE", f"1-{media.MAX_REFERENCE_IMAGES} images whose subject or style the "
                   "video shows", optional=True)],
    VIDEO_OUTPUTS, _vace)

GENERATE_S2V = Node(
    "VLLMOmniGenerateSpeechToVideo", "vLLM-Omni Generate Speech-to-Video",
    f"Wan2.2 S2V-14B on a vLLM-Omni server: the person in 'image' speaks or sings 'audio' (up to "
    f"{media.MAX_AUDIO_S:g} s; Load Audio). The clip is as long as the audio at {S2V.fps:g} fps, made of parts of "
    f"'frames' frames each (0 = {S2V.frames}), with the audio muxed into the server's MP4. Width and height must "
    f"be multiples of {S2V.size_multiple} (0 = {S2V.width}x{S2V.height}).",
    lambda: [Input("server", SERVER_TYPE, "a Local Server running Wan2.2 S2V-14B"),
             text_input("prompt", "what the scene shows, e.g. a woman singing on a stage (required)"),
             text_input("negative_prompt", "what to avoid (empty = the model's own)"),
             Input("image", "IMAGE", "the face or portrait to animate (first image of a batch)"),
             Input("audio", "AUDIO", f"the speech or song, at most {media.MAX_AUDIO_S:g} s"),
             *_common(f"frames per part, a multiple of 4 up to {S2V_FRAMES_PER_CLIP_MAX}; {ZERO} ({S2V.frames})",
                      S2V_FRAMES_PER_CLIP_MAX)],
    VIDEO_OUTPUTS, _s2v)
