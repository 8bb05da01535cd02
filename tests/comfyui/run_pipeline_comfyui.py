"""The VACE, speech-to-video and FastWan templates in a real ComfyUI against the stub server.

Usage (as run_real_comfyui.py: ComfyUI's python, the stub server's python)::

    COMFYUI_DIR=/path/to/ComfyUI VLLM_OMNI_LAUNCHER_TEST_SERVER_PYTHON=/path/to/server/venv/bin/python \\
        python tests/comfyui/run_pipeline_comfyui.py

What it checks (each step raises AssertionError with the reason):

1. Each template's API twin (workflows/api/) queued as it ships, fed by ComfyUI's own loaders from the
   input folder: a 100-frame 1280x720 control.mp4 through Load Video, Get Video Components, Image From
   Batch and Upscale Image (VACE), example.png and a 3 s speech.wav through Load Image and Load Audio
   (S2V); the stub serves each model with its own family's launch. Save Video writes one MP4 of the
   frames the request asked for (VACE 81 at 832x480, S2V one 80-frame clip at 832x448 for 3 s of audio,
   FastWan 17 at 640x352 at 24 fps).
2. A bad input: the VACE template with Image From Batch keeping 50 frames ends the prompt with the
   launcher's own message (50 frames against the request's 81).
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import run_real_comfyui as rr  # noqa: E402  (sets up the import paths and the package alias)
from comfy_harness import WORKFLOWS, ComfyUI, comfyui_version, put_media_inputs  # noqa: E402

TEMPLATES = {   # name -> (widgets changed for the stub, frames, size, fps)
    "wan21_vace_control_video": ({"steps": 2}, 81, (832, 480), 16.0),
    "wan22_s2v_speech_to_video": ({"steps": 2}, 80, (832, 448), 16.0),
    "fastwan_ti2v_5b_fast_text_to_video": ({"width": 640, "height": 352, "frames": 17}, 17, (640, 352), 24.0),
}


def _prompt(name: str) -> dict:
    return json.loads((WORKFLOWS / "api" / f"{name}.api.json").read_text())


def check_template(comfy: ComfyUI, name: str) -> dict[str, Any]:
    import av

    tweaks, frames, (width, height), fps = TEMPLATES[name]
    prompt = _prompt(name)
    job = next(k for k, e in prompt.items() if e["class_type"].startswith("VLLMOmniGenerate"))
    prompt[job]["inputs"].update(tweaks)
    started = time.monotonic()
    entry = comfy.wait_history(comfy.queue(prompt), timeout=600)
    assert entry["status"]["status_str"] == "success", json.dumps(entry["status"])[:4000]
    save = next(k for k, e in prompt.items() if e["class_type"] == "SaveVideo")
    files = [f for f in entry["outputs"][save].get("images", []) + entry["outputs"][save].get("videos", [])
             if f["filename"].endswith(".mp4")]
    assert len(files) == 1, entry["outputs"][save]
    path = comfy.output_dir / files[0]["subfolder"] / files[0]["filename"]
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        got = (sum(1 for _ in container.decode(stream)), (stream.width, stream.height), float(stream.average_rate))
    assert got == (frames, (width, height), fps), (name, got)
    return {"frames": got[0], "size": f"{width}x{height}", "fps": fps, "seconds": round(time.monotonic() - started, 1)}


def check_short_control_video(comfy: ComfyUI) -> str:
    prompt = _prompt("wan21_vace_control_video")
    trim = next(k for k, e in prompt.items() if e["class_type"] == "ImageFromBatch")
    prompt[trim]["inputs"]["length"] = 50
    entry = comfy.wait_history(comfy.queue(prompt), timeout=600)
    errors = [m[1] for m in entry["status"].get("messages", []) if m[0] == "execution_error"]
    assert entry["status"]["status_str"] == "error" and errors, entry["status"]
    message = errors[0]["exception_message"]
    assert message.startswith("The control video has 50 frames, the request 81."), message
    return message.splitlines()[0]


def main() -> int:
    comfy_dir = os.environ.get("COMFYUI_DIR")
    if not comfy_dir:
        sys.exit("set COMFYUI_DIR (a ComfyUI checkout with its requirements installed in this python)")
    python = os.environ.get("COMFYUI_PYTHON", sys.executable)
    work = Path(tempfile.mkdtemp(prefix="vllm-omni-comfyui-pipelines-"))
    report: dict[str, Any] = {"comfyui": comfyui_version(Path(comfy_dir))}
    with rr.comfy_instances(work) as started:
        # one 141 GB GPU: S2V-14B's plan (about 54.5 GiB) fits without offload
        env = {**rr.launcher_env(work, step_s=0.01), "VLLM_OMNI_LAUNCHER_GPU_MEMORY_GB": "141"}
        comfy = ComfyUI(Path(comfy_dir).expanduser().resolve(), python, env)
        started.append(comfy)
        comfy.wait_ready()
        put_media_inputs(comfy.base / "input")
        for name in TEMPLATES:
            report[name] = check_template(comfy, name)
            print(f"{name} ok:", json.dumps(report[name]), flush=True)
        report["short_control_video"] = check_short_control_video(comfy)
        print("short control video refused:", report["short_control_video"], flush=True)
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
