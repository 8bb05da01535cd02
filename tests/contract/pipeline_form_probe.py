"""Server side of tests/contract/test_pipeline_forms.py: what the real vLLM-Omni 0.30 server makes of a
multipart body, up to the pipeline's own pre-processing.

:func:`probe` runs inside ``upstream_resolve.py`` (server python), called by name for a case
``{"call": "pipeline_form_probe:probe", "input": [case, ...]}``. A case is ``{"name", "model_class",
"model", "content_type", "body_b64"}``: the exact bytes a client sent to ``POST /v1/videos``. Each
body goes through upstream's own code: Starlette's multipart parser (its 1 MiB text-part limit
included), ``_parse_video_form`` (``video/generation/helpers.py``),
``OmniOpenAIServingVideo._run_and_extract`` (``serving_video.py``: how references become
``multi_modal_data``, the mixed-reference refusal, sampling params) and then the registered pipeline's
pre-process hook (``diffusion/registry.py`` -> ``get_wan22_vace_pre_process_func`` etc.). Replaced: the
engine (``_run_generation`` records the prompt and stops: there is no GPU) and the app around the one
route (a FastAPI app with upstream's dependency and handler, not vLLM's whole server). Nothing of
upstream is copied. The answer holds, per case, the HTTP status and error, or a summary of the media
and parameters the pipeline would get (an image's pixels as ``pixels_sha256``, once as the handler hands them on
and once as the pre-process hook leaves them). ``registry`` lists, per model class, upstream's registry entry.
:func:`case` (client side) makes a case from the form a ``VideoRequest`` sends.
"""
from __future__ import annotations

import asyncio
import base64
import hashlib
import os
from types import SimpleNamespace
from typing import Any


class _Stop(Exception):
    """The engine call: where the GPU work would start."""

    def __init__(self, prompt: Any, params: Any) -> None:
        super().__init__("engine reached")
        self.prompt, self.params = prompt, params


def case(name: str, family: Any, form: dict[str, Any]) -> dict[str, Any]:
    """A case: `form` (VideoRequest.form_fields, or raw fields) as the exact multipart body the client sends
    (``requests`` prepares it, as client/transport.py does), for `family`'s pipeline class. Client side."""
    import requests

    files = {k: (v if isinstance(v, tuple) else (None, v)) for k, v in form.items()}
    prepared = requests.Request("POST", "http://server/v1/videos", files=files).prepare()
    return {"name": name, "model_class": family.pipeline_class, "model": family.hf_id,
            "content_type": prepared.headers["Content-Type"], "body_b64": base64.b64encode(prepared.body).decode()}


def pixels_sha256(img: Any) -> str:
    """A PIL image's mode, size and pixels as one digest (both sides: the same picture, the same digest)."""
    return hashlib.sha256(f"{img.mode} {img.size}".encode() + img.tobytes()).hexdigest()


def _image(img: Any) -> list[int]:
    return list(img.size)


def _summary(prompt: dict, params: Any, model_class: str) -> dict[str, Any]:
    from vllm_omni.diffusion import registry

    mm = prompt.get("multi_modal_data") or {}
    out: dict[str, Any] = {"keys": sorted(mm)}
    images = mm.get("image")
    if images is not None:
        items = images if isinstance(images, list) else [images]
        out["images"] = [_image(i) for i in items]
        out["pixels_sha256"] = [pixels_sha256(i) for i in items]
    video = mm.get("video")
    if video is not None:
        out["video_frames"] = len(video)
        out["video_item"] = type(video[0]).__name__
        out["video_size"] = _image(video[0]) if hasattr(video[0], "size") else None
    audio = mm.get("audio")
    if audio is not None:
        from vllm.multimodal.media.audio import load_audio

        waveform, rate = load_audio(audio, sr=None, mono=True)
        out["audio"] = {"rate": int(rate), "samples": int(len(waveform)), "is_file": os.path.isfile(audio)}
    out["params"] = {k: getattr(params, k, None) for k in ("width", "height", "num_frames", "num_inference_steps",
                                                           "guidance_scale", "fps")}
    out["extra_args"] = sorted((getattr(params, "extra_args", None) or {}).keys())
    from vllm_omni.diffusion.models.wan2_2.chunked_mp4 import resolve_wan_preencode_mp4

    try:                                # the Wan pipelines' own reading, or its refusal (the job's error)
        out["preencode_mp4"] = resolve_wan_preencode_mp4(params, output_type="np")
    except ValueError as exc:
        out["preencode_mp4"] = f"ValueError: {exc}"
    out["pre_process"] = _pre_process(model_class, prompt, params)
    for path in ([audio] if isinstance(audio, str) else []):
        if os.path.exists(path):
            os.unlink(path)
    return out


def _pre_process(model_class: str, prompt: dict, params: Any) -> dict[str, Any]:
    """Run the pipeline's registered pre-process hook on the prompt, as the engine does first
    (upstream's own lookup: registry.get_diffusion_pre_process_func)."""
    from vllm_omni.diffusion.registry import get_diffusion_pre_process_func

    hook = get_diffusion_pre_process_func(SimpleNamespace(model_class_name=model_class, custom_pipeline_args=None,
                                                          diffusion_load_format="default"))
    if hook is None:
        return {"hook": None}
    request = SimpleNamespace(prompt=prompt, sampling_params=params, batch_compatibility_key=None)
    try:
        hook(request)
    except Exception as exc:                   # the pipeline's own refusal, as the job error would carry
        return {"hook": True, "error": f"{type(exc).__name__}: {exc}"}
    info = (request.prompt.get("additional_information") or {}) if isinstance(request.prompt, dict) else {}
    result: dict[str, Any] = {"hook": True, "info_keys": sorted(info)}
    if info.get("reference_images") is not None:
        result["reference_images"] = [_image(i) for i in info["reference_images"]]
    if info.get("source_video") is not None:
        result["source_video_frames"] = len(info["source_video"])
    if "audio_path" in info:
        result["audio_path_set"] = info["audio_path"] is not None
    result["size"] = [request.sampling_params.width, request.sampling_params.height]
    image = (request.prompt.get("multi_modal_data") or {}).get("image") if isinstance(request.prompt, dict) else None
    if hasattr(image, "tobytes"):
        result["pixels_sha256"] = pixels_sha256(image)
    return result


async def _run(case: dict[str, Any]) -> dict[str, Any]:
    import httpx
    from fastapi import Depends, FastAPI

    from vllm_omni.entrypoints.openai.serving_video import OmniOpenAIServingVideo
    from vllm_omni.entrypoints.openai.video.generation.helpers import _parse_video_form

    engine = SimpleNamespace(od_config=SimpleNamespace(model_class_name=case["model_class"], model=case["model"],
                                                       revision=None))
    handler = OmniOpenAIServingVideo(engine, model_name=case["model"])

    async def reached(prompt, params, reference_id, on_started=None):
        raise _Stop(prompt, params)

    handler._run_generation = reached
    app = FastAPI()
    app.state.openai_serving_video = handler
    app.state.openai_serving_models = None
    app.state.stage_configs = None
    result: dict[str, Any] = {}

    @app.post("/v1/videos")
    async def create(parsed=Depends(_parse_video_form)):
        request, handler_, _, image, video, audio, _, latent = parsed
        try:
            await handler_._run_and_extract(request, "probe", reference_image=image, reference_video=video,
                                            reference_audio=audio, latent_edit_input=latent)
        except _Stop as stop:
            result.update(_summary(stop.prompt, stop.params, case["model_class"]))
        return {"ok": True}

    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://probe") as client:
        answer = await client.post("/v1/videos", content=base64.b64decode(case["body_b64"]),
                                   headers={"content-type": case["content_type"]})
    try:
        body = answer.json()
    except ValueError:
        body = {"text": answer.text[:500]}
    handler.shutdown()
    return {"status": answer.status_code, "error": None if answer.status_code == 200 else body, **result}


def probe(cases: list[dict[str, Any]]) -> dict[str, Any]:
    """Each case through upstream (see the module docstring), and the registry entry of each model class."""
    from vllm_omni.diffusion.registry import _DIFFUSION_MODELS

    return {"registry": {c["model_class"]: list(_DIFFUSION_MODELS.get(c["model_class"]) or ()) for c in cases},
            "cases": {c["name"]: asyncio.run(_run(c)) for c in cases}}
