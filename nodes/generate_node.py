"""Generate video: prompt (and image) to IMAGE frames, fps and VIDEO, through a server handle."""
from __future__ import annotations

import threading
from typing import Any, Optional

from ..client.api import GenerationCancelled, VideoClient, VideoRequest
from ..client.frames import image_to_png
from ..errors import LauncherError
from ..models import check_request
from ..server import supervisor
from ..server.local_config import load_local_config
from . import comfy_bridge, progress
from .handles import SERVER_TYPE, ServerHandle

CATEGORY = "vLLM-Omni"
MODEL_DEFAULT = "0 or -1 = the model's recommended value"


class GenerateVideo:
    """Run one Wan2.2 job on the server and return its frames."""

    DESCRIPTION = ("Text (and image) to video on a vLLM-Omni server. Zero (or -1 for guidance, boundary and "
                   "shift) means the model's recommended value: A14B 832x480, 81 frames at 16 fps; TI2V-5B "
                   "1280x704, 121 frames at 24 fps. Cancel deletes the job on the server.")
    CATEGORY = CATEGORY
    RETURN_TYPES = ("IMAGE", "FLOAT", "VIDEO")
    RETURN_NAMES = ("frames", "fps", "video")
    FUNCTION = "generate"

    @classmethod
    def INPUT_TYPES(cls):  # noqa: N802
        return {
            "required": {
                "server": (SERVER_TYPE,),
                "prompt": ("STRING", {"multiline": True, "default": ""}),
                "negative_prompt": ("STRING", {"multiline": True, "default": ""}),
                "width": ("INT", {"default": 0, "min": 0, "max": 4096, "step": 16, "tooltip": MODEL_DEFAULT}),
                "height": ("INT", {"default": 0, "min": 0, "max": 4096, "step": 16, "tooltip": MODEL_DEFAULT}),
                "frames": ("INT", {"default": 0, "min": 0, "max": 1025,  # no step: the UI snaps to min + k*step (4k)
                                   "tooltip": "4k+1 frames (81, 121, ...); " + MODEL_DEFAULT}),
                "fps": ("FLOAT", {"default": 0.0, "min": 0.0, "max": 120.0, "step": 1.0, "tooltip": MODEL_DEFAULT}),
                "steps": ("INT", {"default": 0, "min": 0, "max": 200, "tooltip": MODEL_DEFAULT}),
                "guidance": ("FLOAT", {"default": -1.0, "min": -1.0, "max": 20.0, "step": 0.1,
                                       "tooltip": "CFG of the high-noise expert; " + MODEL_DEFAULT}),
                "guidance_2": ("FLOAT", {"default": -1.0, "min": -1.0, "max": 20.0, "step": 0.1,
                                         "tooltip": "CFG of the low-noise expert (A14B); " + MODEL_DEFAULT}),
                "boundary_ratio": ("FLOAT", {"default": -1.0, "min": -1.0, "max": 1.0, "step": 0.005,
                                             "tooltip": "A14B expert switch; a server-side value wins; "
                                                        + MODEL_DEFAULT}),
                "flow_shift": ("FLOAT", {"default": -1.0, "min": -1.0, "max": 50.0, "step": 0.5,
                                         "tooltip": MODEL_DEFAULT}),
                "seed": ("INT", {"default": 0, "min": 0, "max": 2**63 - 1, "control_after_generate": True}),
            },
            "optional": {"image": ("IMAGE", {"tooltip": "start frame: required for I2V-A14B, optional for TI2V-5B"})},
            "hidden": {"unique_id": "UNIQUE_ID"},
        }

    def generate(self, server: ServerHandle, prompt: str, negative_prompt: str, width: int, height: int,
                 frames: int, fps: float, steps: int, guidance: float, guidance_2: float, boundary_ratio: float,
                 flow_shift: float, seed: int, image: Any = None, unique_id: Optional[str] = None):
        fam = server.family
        width, height, frames = width or fam.width, height or fam.height, frames or fam.frames
        fps, steps = fps or fam.fps, steps or fam.steps
        if not prompt.strip():
            raise LauncherError("The prompt is empty", "vLLM-Omni requires a prompt", "write a prompt",
                                setting="prompt")
        check_request(fam, width=width, height=height, frames=frames, has_image=image is not None)
        request = VideoRequest(
            prompt=prompt, negative_prompt=negative_prompt, width=width, height=height, num_frames=frames,
            fps=fps, steps=steps,
            guidance=fam.guidance if guidance < 0 else guidance,
            guidance_2=(fam.guidance_2 if guidance_2 < 0 else guidance_2) if fam.experts == 2 else None,
            boundary_ratio=(fam.boundary_ratio if boundary_ratio < 0 else boundary_ratio)
            if fam.experts == 2 else None,
            flow_shift=fam.flow_shift if flow_shift < 0 else flow_shift,
            seed=seed,
            image_png=image_to_png(comfy_bridge.image_to_uint8(image)) if image is not None else None)

        sup = supervisor.find(server.server_id) if server.kind == "local" else None
        if server.kind == "local":
            if sup is None or not sup.alive():
                raise LauncherError("The local server is not running", "it was stopped or died since the "
                                    "Local server node ran", "queue the workflow again: Local server restarts it",
                                    setting="server")
            api_key = sup.api_key
        else:
            api_key = load_local_config().api_key_for(server.url)
        client = VideoClient(server.url, api_key=api_key, served_name=server.served_name,
                             server_version=server.server_version)

        units = progress.work_units(width, height, frames, steps)
        last = sup.progress() if sup is not None else None
        tracker = progress.JobProgress(
            bar=comfy_bridge.progress_bar(steps, unique_id),
            send_text=lambda text: comfy_bridge.send_status(text, unique_id),
            steps=steps,
            local_progress=sup.progress if sup is not None else None,
            run_floor=last.run_id if last is not None else -1,
            remote_estimate_s=progress.estimate(server.url, server.family_key, units),
        )

        def on_update(update: Any) -> None:
            if sup is not None:
                sup.mark_job_activity()
            try:
                tracker.on_update(update)      # ComfyUI's ProgressBar raises here on Cancel
            except Exception as exc:
                if comfy_bridge.is_interrupt_exception(exc):
                    raise GenerationCancelled(update.job_id, update.status) from exc
                raise

        try:
            result = client.generate(request, on_update=on_update, should_cancel=comfy_bridge.interrupted)
        except GenerationCancelled as cancelled:
            if sup is not None and cancelled.job_id:
                # Upstream cannot stop a running Wan denoise; the supervisor restarts the server if the
                # GPU is still busy after a grace period. In the background: the node ends now.
                comfy_bridge.send_status("Cancelled. The server is restarted if the GPU keeps working on it.",
                                         unique_id)
                threading.Thread(target=sup.hard_cancel, args=(cancelled.job_id,), daemon=True,
                                 name="vllm-omni-hard-cancel").start()
            comfy_bridge.raise_interrupted()
            raise
        tracker.finish()
        timings = result.timings
        progress.learn(server.url, server.family_key, units, timings.get("running", 0.0))
        video = result.video
        comfy_bridge.send_status(f"Done: {video.frames.shape[0]} frames {video.frames.shape[2]}x"
                                 f"{video.frames.shape[1]} at {video.fps:g} fps in {timings.get('decoded', 0):.1f}s",
                                 unique_id)
        return (comfy_bridge.to_image(video.frames), float(video.fps), comfy_bridge.make_video(result.mp4, video.fps))
