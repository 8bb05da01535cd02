"""Generate Video: prompt (and image) to IMAGE frames, fps and VIDEO, through a server handle."""
from __future__ import annotations

from typing import Any, Optional

from ..client.request import DEFAULT_SAMPLER, SAMPLERS, FrameInterpolation
from ..errors import LauncherError
from . import comfy_bridge, session
from .handles import SERVER_TYPE, ServerHandle

CATEGORY = "vLLM-Omni"
ZERO = "0 = the model's recommended value"
MINUS_ONE = "-1 = the model's recommended value"
NO_MODEL = "(none)"
INTERPOLATION = {"off": 0, "x2": 1, "x4": 2}      # widget -> RIFE exp (frames and fps times 2**exp)


def interpolation_for(choice: str, model_name: str) -> Optional[FrameInterpolation]:
    """The frame interpolation widgets as a request part; the RIFE folder must be a list entry."""
    exp = INTERPOLATION.get(choice)
    if exp is None:
        raise LauncherError(f"Frame interpolation '{choice}' is not known", "allowed: off, x2, x4",
                            "pick off, x2 or x4", setting="frame_interpolation")
    if not exp:
        return None
    path = comfy_bridge.interpolation_models().get(model_name)
    if path is None:
        raise LauncherError(
            f"Frame interpolation model '{model_name}' is not available",
            "frame interpolation needs a RIFE folder (holding flownet.pkl) under ComfyUI/models/frame_interpolation; "
            "the launcher never lets the server download one",
            "put a RIFE folder (e.g. RIFE-4.22.lite) there, refresh the node definitions (press R) and pick it as "
            "interpolation_model, or set frame_interpolation to off", setting="interpolation_model")
    return FrameInterpolation(str(path), exp)


class GenerateVideo:
    """Run one Wan2.2 job on the server and return its frames."""

    DESCRIPTION = ("Text (and image) to video on a vLLM-Omni server. 0 (for sizes, frames, fps, steps) or -1 (for "
                   "guidance, boundary and shift) means the model's recommended value: A14B 832x480, 81 frames at "
                   "16 fps; TI2V-5B 1280x704, 121 frames at 24 fps. When the serving plan fits less than that, "
                   "widgets at 0 take the plan's size and frames (the node says so). Inputs are checked before "
                   "anything is sent. A stopped local server is started again. Cancel deletes the job on the "
                   "server.")
    CATEGORY = CATEGORY
    RETURN_TYPES = ("IMAGE", "FLOAT", "VIDEO")
    RETURN_NAMES = ("frames", "fps", "video")
    OUTPUT_TOOLTIPS = ("the decoded frames, IMAGE [frames, height, width, 3] float32 0..1",
                       "the video's frame rate, for nodes that take IMAGE + fps (e.g. Create Video)",
                       "the server's MP4 as ComfyUI VIDEO, not re-encoded: connect to Save Video")
    FUNCTION = "generate"
    OWN_CHOICE_CHECKS = ("interpolation_model",)   # interpolation_for says where they come from (input_checks.py)

    @classmethod
    def INPUT_TYPES(cls):  # noqa: N802
        return {
            "required": {
                "server": (SERVER_TYPE, {"tooltip": "where the job runs: Local Server or Remote Server"}),
                "prompt": ("STRING", {"multiline": True, "default": "",
                                      "tooltip": "what the video shows and how the camera moves (required)"}),
                "negative_prompt": ("STRING", {"multiline": True, "default": "",
                                               "tooltip": "what to avoid, e.g. blurry, jitter, watermark "
                                                          "(empty = none)"}),
                "width": ("INT", {"default": 0, "min": 0, "max": 4096, "step": 16,
                                  "tooltip": "multiple of 16 (A14B) or 32 (TI2V-5B); " + ZERO}),
                "height": ("INT", {"default": 0, "min": 0, "max": 4096, "step": 16,
                                   "tooltip": "multiple of 16 (A14B) or 32 (TI2V-5B); " + ZERO}),
                "frames": ("INT", {"default": 0, "min": 0, "max": 1025,  # no step: the UI snaps to min + k*step
                                   "tooltip": "4k+1 frames (81, 121, ...); " + ZERO}),
                "fps": ("FLOAT", {"default": 0.0, "min": 0.0, "max": 120.0, "step": 1.0,
                                  "tooltip": "frame rate of the MP4 (Wan does not use it); " + ZERO +
                                             " (16 A14B, 24 TI2V-5B)"}),
                "steps": ("INT", {"default": 0, "min": 0, "max": 200,
                                  "tooltip": "denoise steps (40 A14B, 50 TI2V-5B); " + ZERO}),
                "guidance": ("FLOAT", {"default": -1.0, "min": -1.0, "max": 20.0, "step": 0.1,
                                       "tooltip": "CFG scale (of the high-noise expert on A14B); 1 = no CFG; "
                                                  + MINUS_ONE}),
                "guidance_2": ("FLOAT", {"default": -1.0, "min": -1.0, "max": 20.0, "step": 0.1,
                                         "tooltip": "CFG of the low-noise expert (A14B only); " + MINUS_ONE}),
                "boundary_ratio": ("FLOAT", {"default": -1.0, "min": -1.0, "max": 1.0, "step": 0.005,
                                             "tooltip": "A14B expert switch point; a server-side value wins; "
                                                        + MINUS_ONE}),
                "flow_shift": ("FLOAT", {"default": -1.0, "min": -1.0, "max": 50.0, "step": 0.5,
                                         "tooltip": "scheduler flow shift; " + MINUS_ONE}),
                "seed": ("INT", {"default": 0, "min": 0, "max": 2**63 - 1, "control_after_generate": True,
                                 "tooltip": "noise seed: the same seed and settings give the same video; a new "
                                            "seed re-runs only this node"}),
            },
            "optional": {
                "image": ("IMAGE", {"tooltip": "start frame: required for I2V-A14B, optional for "
                                               "TI2V-5B, refused by T2V-A14B (first image of a batch)"}),
                # Optional and after the original widgets: saved workflows store values by position,
                # and released API workflows (without them) must still validate.
                "sampler": (list(SAMPLERS), {"default": DEFAULT_SAMPLER,
                                             "tooltip": "unipc (upstream's default) or euler (for 4-step "
                                                        "distill LoRAs such as lightx2v)"}),
                "frame_interpolation": (list(INTERPOLATION), {
                    "default": "off", "tooltip": "RIFE after decoding: x2 / x4 the frames and the fps "
                                                 "(frames become (F-1)*k+1); needs interpolation_model"}),
                "interpolation_model": ([NO_MODEL, *sorted(comfy_bridge.interpolation_models())], {
                    "default": NO_MODEL, "tooltip": "a RIFE folder (flownet.pkl) under "
                                                    "ComfyUI/models/frame_interpolation; local servers only"}),
            },
            "hidden": {"unique_id": "UNIQUE_ID"},
        }

    def generate(self, server: ServerHandle, prompt: str, negative_prompt: str, width: int, height: int,
                 frames: int, fps: float, steps: int, guidance: float, guidance_2: float, boundary_ratio: float,
                 flow_shift: float, seed: int, sampler: str = DEFAULT_SAMPLER, frame_interpolation: str = "off",
                 interpolation_model: str = NO_MODEL, image: Any = None, unique_id: Optional[str] = None):
        return session.generate_video(
            server, image=image, node_id=unique_id, sampler=sampler,
            interpolation=interpolation_for(frame_interpolation, interpolation_model), prompt=prompt,
            negative_prompt=negative_prompt, width=width, height=height, frames=frames, fps=fps, steps=steps,
            guidance=guidance, guidance_2=guidance_2, boundary_ratio=boundary_ratio, flow_shift=flow_shift,
            seed=seed)
