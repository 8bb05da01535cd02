"""What the ComfyUI end-to-end run (bench/gpu_comfyui_e2e.py) builds and reads, as pure functions: the
API prompt it queues (a template's twin with probe nodes), ComfyUI's websocket events (progress, text,
executed and cached nodes), /history outputs (probe values, the saved frame and video), the server log
(jobs received, the server's own times), the planner's prediction for the request, and the report's
verdict. Tested without ComfyUI or a server (tests/unit/test_gpu_e2e_script.py).
"""
from __future__ import annotations

import copy
import json
import os
import re
import struct
from pathlib import Path
from typing import Any, Optional

from gpu.common import import_package

REPO = Path(__file__).resolve().parents[1]
PKG = Path(os.environ.get("VLLM_OMNI_LAUNCHER_PKG") or REPO).resolve()   # the pack ComfyUI loads (gpu_e2e.PKG)
T2V = "wan22_ti2v_5b_text_to_video"
I2V = "wan22_ti2v_5b_image_to_video"
TEXT_EVENT = 3                                   # ComfyUI's BinaryEventTypes.TEXT (send_progress_text)
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
JOB_LINE = re.compile(r'"POST /v1/videos HTTP/1\.[01]" \d{3}')
STAGE_MS = re.compile(r"\|\s*stage_gen_time_ms\s*\|\s*([\d.]+)\s*\|")
ENCODE_MS = re.compile(r"Video response encoding \(MP4 bytes\): ([\d.]+) ms")
STEP = re.compile(r"(\d+)/(\d+)")


def load_api(name: str) -> dict:
    return json.loads((PKG / "workflows" / "api" / f"{name}.api.json").read_text())


def node_of(prompt: dict, class_type: str) -> str:
    return next(k for k, e in prompt.items() if e["class_type"] == class_type)


def build_prompt(template: dict, model: str, generate: dict, serving: Optional[dict] = None,
                 probes: bool = True) -> dict:
    """The template's API twin pointed at ``model``, with Generate Video / Serving Config
    inputs overridden, plus probe nodes that make the IMAGE and fps visible in /history:
    Get Image Size -> Preview Any (width, height, batch), Preview Any (fps), and frame 0 of the
    IMAGE through Image From Batch into Save Image (a real save node, channels checkable)."""
    prompt = copy.deepcopy(template)
    prompt[node_of(prompt, "VLLMOmniLoadModel")]["inputs"]["model"] = model
    prompt[node_of(prompt, "VLLMOmniServingConfig")]["inputs"].update(serving or {})
    gen = node_of(prompt, "VLLMOmniGenerateVideo")
    prompt[gen]["inputs"].update(generate)
    if probes:
        prompt["90"] = {"class_type": "GetImageSize", "inputs": {"image": [gen, 0]}}
        for slot, name in enumerate(("width", "height", "batch")):
            prompt[f"9{slot + 1}"] = {"class_type": "PreviewAny", "inputs": {"source": ["90", slot]},
                                      "_meta": {"title": name}}
        prompt["94"] = {"class_type": "PreviewAny", "inputs": {"source": [gen, 1]}, "_meta": {"title": "fps"}}
        prompt["95"] = {"class_type": "ImageFromBatch", "inputs": {"image": [gen, 0], "batch_index": 0, "length": 1}}
        prompt["96"] = {"class_type": "SaveImage", "inputs": {"images": ["95", 0], "filename_prefix": "e2e/frame0"}}
    return prompt


def probe_values(outputs: dict) -> dict[str, Optional[float]]:
    """width / height / batch / fps from the Preview Any nodes' ui text in a /history entry."""
    values: dict[str, Optional[float]] = {}
    for node, name in (("91", "width"), ("92", "height"), ("93", "batch"), ("94", "fps")):
        text = (outputs.get(node) or {}).get("text") or [None]
        try:
            values[name] = float(text[0])
        except (TypeError, ValueError):
            values[name] = None
    return values


def count_jobs(log_text: str) -> int:
    """Video jobs a server log says it received (uvicorn's POST /v1/videos access lines)."""
    return len(JOB_LINE.findall(ANSI.sub("", log_text)))


def server_times(log_text: str) -> list[dict[str, float]]:
    """Per job, the server's own seconds from its log: stage generation time (the stats table)
    and the MP4 encoding line; the two come one after the other per job."""
    text = ANSI.sub("", log_text)
    stages = [float(x) / 1000 for x in STAGE_MS.findall(text)]
    encodes = [float(x) / 1000 for x in ENCODE_MS.findall(text)]
    out = []
    for i, stage in enumerate(stages):
        encode = encodes[i] if i < len(encodes) else 0.0
        out.append({"stage_gen_s": round(stage, 6), "mp4_encode_s": round(encode, 6),
                    "server_s": round(stage + encode, 4)})
    return out


def bar_positions(events: list[dict], node: str) -> list[list[float]]:
    """The node's progress bar as [value, max], in order, repeats dropped. ComfyUI 0.3.64 sends a V3
    node's `set_progress` only as `progress_state` (every non-pending node's state, per update:
    comfy_execution/progress.py WebUIProgressHandler); the legacy `progress` event comes only from
    comfy.utils.ProgressBar's hook (main.py hijack_progress). The front end draws the bar from either."""
    bars: list[list[float]] = []
    for e in events:
        if e["type"] == "progress" and str(e["data"].get("node")) == node:
            bar = [e["data"].get("value"), e["data"].get("max")]
        elif e["type"] == "progress_state" and node in (e["data"].get("nodes") or {}):
            state = e["data"]["nodes"][node]
            bar = [state.get("value"), state.get("max")]
        else:
            continue
        if not bars or bars[-1] != bar:
            bars.append(bar)
    return bars


def summarize_progress(events: list[dict], node: str) -> dict[str, Any]:
    """What the websocket showed for one node: its bar positions and its text messages."""
    bars = bar_positions(events, node)
    texts = [e["text"] for e in events if e["type"] == "text" and e["node"] == node]
    steps = sorted({int(m.group(1)) for t in texts for m in [STEP.search(t)] if m and "Step" in t})
    return {"progress_events": len(bars), "progress_last": bars[-1] if bars else None,
            "texts": len(texts), "first_text": texts[0] if texts else None, "last_text": texts[-1] if texts else None,
            "denoise_steps_seen": steps}


def executed_nodes(events: list[dict], prompt_id: str) -> tuple[list[str], list[str]]:
    """(nodes that ran, nodes served from cache) for one prompt, from the websocket."""
    ran = [str(e["data"]["node"]) for e in events if e["type"] == "executing"
           and e["data"].get("prompt_id") == prompt_id and e["data"].get("node") is not None]
    cached = [str(n) for e in events if e["type"] == "execution_cached"
              and e["data"].get("prompt_id") == prompt_id for n in e["data"].get("nodes", [])]
    return sorted(set(ran)), sorted(set(cached))


def verdict(report: dict) -> dict:
    """all_ok and the list of failed checks from every check's ``ok``."""
    checks = report.get("checks", {})
    failed = sorted(k for k, c in checks.items() if c.get("ok") is False)
    report["failed"] = failed
    report["all_ok"] = bool(checks) and not failed and all(c.get("ok") is True for c in checks.values())
    return report


def binary_event(raw: bytes) -> dict:
    """One binary websocket message: our nodes' text (node id and text), any other kind by its number."""
    kind = struct.unpack(">I", raw[:4])[0]
    if kind != TEXT_EVENT:
        return {"type": f"binary{kind}", "data": {}}
    n = struct.unpack(">I", raw[4:8])[0]
    return {"type": "text", "data": {}, "node": raw[8:8 + n].decode(), "text": raw[8 + n:].decode(errors="replace")}


def planner_prediction(model_dir: Path, inputs: dict, gpus: Optional[list[float]]) -> dict:
    """What the planner recommends for this request on this machine (serving `auto` asks the
    same function): its configuration and predicted per-GPU peak, to set against NVML's.
    `gpus`: the GPU sizes to assume (the CPU rehearsal), None for the machine's own."""
    try:
        import_package()
        from vllm_omni_launcher.planner.ladder import recommend
        from vllm_omni_launcher.planner.memory import RequestShape

        rec = recommend(str(model_dir), RequestShape(inputs["width"], inputs["height"], inputs["frames"]), gpus=gpus)
        return {"label": rec.label, "flags": None if rec.spec is None else rec.spec.flags(),
                "peak_gib": None if rec.plan is None else round(rec.plan.peak_gib, 2),
                "gpus": [] if rec.plan is None else [g.to_dict() for g in rec.plan.gpus]}
    except Exception as exc:   # the prediction is a measurement aid; its failure is reported
        return {"error": f"{type(exc).__name__}: {exc}"[:1000]}


def output_files(base: Path, outputs: dict) -> dict:
    """The SaveImage frame (size, mode) and the SaveVideo file (frames, size, fps by PyAV) of a
    /history entry's outputs, under ComfyUI's base directory `base`."""
    found: dict[str, Any] = {}
    for out in outputs.values():
        for kind in ("images", "videos", "animated"):
            for item in out.get(kind, []) if isinstance(out.get(kind), list) else []:
                if not isinstance(item, dict) or "filename" not in item:
                    continue
                path = base / item.get("type", "output") / item.get("subfolder", "") / item["filename"]
                if path.suffix.lower() == ".png":
                    from PIL import Image

                    with Image.open(path) as im:
                        found["frame0_png"] = {"size": list(im.size), "mode": im.mode}
                else:
                    found["video_file"] = describe_video(path)
    return found


def describe_video(path: Path) -> dict:
    """Frames, size, fps and bytes of a video file, decoded by PyAV (what ComfyUI's VIDEO holds)."""
    import av

    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        frames = sum(1 for _ in container.decode(stream))
        return {"file": path.name, "bytes": path.stat().st_size, "frames": frames,
                "size": [stream.codec_context.width, stream.codec_context.height],
                "fps": float(stream.average_rate or 0), "codec": stream.codec_context.name}
