"""Generate Batch in a real ComfyUI against the stub server: registration, a batch run, Cancel of all.

Usage (as run_real_comfyui.py: ComfyUI's python, the stub server's python)::

    COMFYUI_DIR=/path/to/ComfyUI VLLM_OMNI_LAUNCHER_TEST_SERVER_PYTHON=/path/to/server/venv/bin/python \\
        python tests/comfyui/run_batch_comfyui.py

What it checks (each step raises AssertionError with the reason):

1. ``/object_info`` has ``VLLMOmniGenerateBatch`` from this pack, its VIDEO output marked as a
   list (``output_is_list``) and its inputs in the order ``tests/unit/test_workflows.py`` derives
   from the node class.
2. A run: the TI2V template's API twin with Generate Video replaced by Generate Batch (two prompt
   lines x ``batch_count`` 2, tiny clips), Save Video fed by its VIDEO list and Save Image by its
   IMAGE. ComfyUI runs Save Video once per clip: four MP4s, each decoding to its own seed, and
   Save Image writes the 4 x 5 frames in prompt-then-seed order. The server's own access log
   shows exactly four more ``POST /v1/videos``.
3. Cancel: the same batch with 200 steps of 0.05 s; ``/interrupt`` once the server has received
   all four jobs ends the prompt as interrupted, and the server's access log shows a
   ``DELETE /v1/videos/<id>`` for each of the four jobs.
"""
from __future__ import annotations

import copy
import io
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import run_real_comfyui as rr  # noqa: E402  (sets up the import paths and the package alias)
import behaviour_checks as bc  # noqa: E402
from comfy_harness import PACK_NAME, ComfyUI  # noqa: E402
from vllm_omni_launcher.nodes.batch_session import prompt_lines  # noqa: E402

BATCH = "VLLMOmniGenerateBatch"
PROMPTS = "a red fox in snow\n\na grey owl at night\n"
SEEDS = (70, 71)              # seed and batch_count 2
DELETE_LINE = re.compile(r'"DELETE /v1/videos/([^ /"]+) HTTP/1\.[01]" \d{3}')


def batch_prompt(seed: int, **inputs: Any) -> dict:
    """The TI2V template's API twin with Generate Batch in place of Generate Video, plus Save Image."""
    prompt = copy.deepcopy(bc.load_api(bc.TI2V_TEMPLATE))
    gen_id = bc.node_of(prompt, "VLLMOmniGenerateVideo")
    gen = prompt[gen_id]
    values = {k: v for k, v in gen["inputs"].items() if k != "prompt"}
    values.update({**bc.TINY, "prompts": PROMPTS, "seed": seed, "batch_count": len(SEEDS), **inputs})
    prompt[gen_id] = {"inputs": values, "class_type": BATCH, "_meta": {"title": "vLLM-Omni Generate Batch"}}
    prompt["90"] = {"inputs": {"filename_prefix": "batch/frames", "images": [gen_id, 0]}, "class_type": "SaveImage",
                    "_meta": {"title": "Save Image"}}
    return prompt


def check_registration(comfy: ComfyUI) -> dict:
    info = comfy.get(f"/object_info/{BATCH}")[BATCH]
    assert info["python_module"] == f"custom_nodes.{PACK_NAME}", info["python_module"]
    assert info["display_name"] == "vLLM-Omni Generate Batch" and info["category"] == "vLLM-Omni"
    assert info["output"] == ["IMAGE", "FLOAT", "VIDEO", "STRING"], info["output"]
    assert info["output_is_list"] == [False, False, True, False], info["output_is_list"]
    ours = [(name, section) for name, _, section in rr.wf.node_defs()[BATCH].inputs]
    real = [(name, section) for section in ("required", "optional") for name in info["input_order"].get(section, [])]
    assert ours == real, f"input order {real} != {ours}"
    return {"outputs": info["output"], "output_is_list": info["output_is_list"]}


def check_batch_run(comfy: ComfyUI, logs: bc.LauncherLogs) -> dict:
    import av
    import numpy as np
    from PIL import Image

    import frame_code

    before = logs.jobs()
    prompt = batch_prompt(SEEDS[0])
    started = time.monotonic()
    entry = bc.run_to_success(comfy, prompt)
    elapsed = time.monotonic() - started
    save_video = bc.node_of(prompt, "SaveVideo")
    out = entry["outputs"].get(save_video, {})
    videos = [f for f in out.get("images", []) + out.get("videos", []) if f["filename"].endswith(".mp4")]
    clips = [(seed, text) for text in prompt_lines(PROMPTS) for seed in SEEDS]
    assert len(videos) == len(clips), f"Save Video reported {out}"
    seeds_seen = []
    for item in videos:
        data = comfy.get_bytes(comfy.view_url(item["filename"], item["subfolder"], item["type"]))
        with av.open(io.BytesIO(data)) as container:
            frames = [f.to_ndarray(format="rgb24") for f in container.decode(container.streams.video[0])]
        decoded = [frame_code.decode(f.astype(np.float32) / 255.0) for f in frames]
        assert [i for i, _ in decoded] == list(range(bc.TINY["frames"])), decoded
        seeds_seen.append(decoded[0][1])
    assert seeds_seen == [seed for seed, _ in clips], seeds_seen
    images = entry["outputs"].get("90", {}).get("images", [])
    assert len(images) == len(clips) * bc.TINY["frames"], f"Save Image wrote {len(images)} images"
    codes = []
    for item in images:
        with Image.open(comfy.output_dir / item["subfolder"] / item["filename"]) as im:
            codes.append(frame_code.decode(np.asarray(im.convert("RGB"))))
    assert codes == [(i, seed) for seed, _ in clips for i in range(bc.TINY["frames"])], codes
    jobs = logs.jobs() - before
    assert jobs == len(clips), f"the server received {jobs} jobs for a batch of {len(clips)}"
    return {"clips": len(videos), "frames_saved": len(images), "jobs_sent": jobs, "seconds": round(elapsed, 1)}


def check_cancel(comfy: ComfyUI, logs: bc.LauncherLogs, steps: int = 200) -> dict:
    """`steps` long enough that the batch is still running once its first clip denoises (at the
    stub's seconds per step), short enough that the cancelled denoise drains."""
    before_jobs = logs.jobs()
    before_deletes = set(DELETE_LINE.findall(logs.text()))
    # the denoise bar's redraws of this batch's `steps` (upstream's tqdm: "  1%|...| 2/200 [00:01<...]")
    denoised = re.compile(rf"\|\s*[1-9]\d*/{steps} \[")
    before_steps = len(denoised.findall(logs.text()))
    prompt = batch_prompt(SEEDS[0] + 100, steps=steps)
    prompt_id = comfy.queue(prompt)
    clips = len(prompt_lines(PROMPTS)) * len(SEEDS)
    deadline = time.monotonic() + 300
    while logs.jobs() - before_jobs < clips:
        assert time.monotonic() < deadline, "the batch's jobs never reached the server"
        assert not comfy.get(f"/history/{prompt_id}"), "the prompt ended before all its jobs were sent"
        time.sleep(0.2)
    while len(denoised.findall(logs.text())) <= before_steps:        # the first clip is denoising
        assert time.monotonic() < deadline, "the batch's first clip never started denoising"
        assert not comfy.get(f"/history/{prompt_id}"), "the prompt ended before its first clip denoised"
        time.sleep(0.2)
    assert not comfy.get(f"/history/{prompt_id}"), "the batch finished before the interrupt"
    asked = time.monotonic()
    comfy.interrupt(prompt_id)
    entry = comfy.wait_history(prompt_id, timeout=60, poll=0.1)
    ended_s = time.monotonic() - asked
    kinds = bc.messages(entry)
    assert "execution_interrupted" in kinds, f"not interrupted: {entry['status'].get('status_str')} {list(kinds)}"
    deadline = time.monotonic() + 30
    while True:
        deleted = set(DELETE_LINE.findall(logs.text())) - before_deletes
        if len(deleted) >= clips or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert len(deleted) == clips, f"the server saw DELETE for {len(deleted)} of the {clips} jobs: {sorted(deleted)}"
    return {"interrupted_in_s": round(ended_s, 2), "jobs_deleted": len(deleted)}


def main() -> int:
    comfy_dir = os.environ.get("COMFYUI_DIR")
    if not comfy_dir:
        sys.exit("set COMFYUI_DIR (a ComfyUI checkout with its requirements installed in this python)")
    python = os.environ.get("COMFYUI_PYTHON", sys.executable)
    work = Path(tempfile.mkdtemp(prefix="vllm-omni-comfyui-batch-"))
    report: dict[str, Any] = {"comfyui": rr.comfyui_version(Path(comfy_dir))}
    with rr.comfy_instances(work) as started:
        comfy, logs = rr._started(Path(comfy_dir).expanduser().resolve(), python, work, step_s=0.05)
        started.append(comfy)
        for name, check in (("registration", lambda: check_registration(comfy)),
                            ("batch_run", lambda: check_batch_run(comfy, logs)),
                            ("cancel", lambda: check_cancel(comfy, logs))):
            report[name] = check()
            print(f"{name} ok:", json.dumps(report[name]), flush=True)
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
