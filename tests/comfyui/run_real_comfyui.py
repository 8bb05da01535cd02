"""Check the pack inside a real ComfyUI: registration, a run, caching, Cancel, text and progress, templates.

Usage (ComfyUI's python; the stub server's python as in the unit tests)::

    COMFYUI_DIR=/path/to/ComfyUI VLLM_OMNI_LAUNCHER_TEST_SERVER_PYTHON=/path/to/server/venv/bin/python \\
        python tests/comfyui/run_real_comfyui.py [--screenshots docs/screenshots] [--thumbnails]

What it does (each step raises AssertionError with the reason when something is wrong):

1. Starts ComfyUI from ``COMFYUI_DIR`` on CPU with only this pack (``comfy_harness``), with the
   launcher pointed at the stub vLLM-Omni server by local configuration only (environment of
   the ComfyUI process: ``VLLM_OMNI_LAUNCHER_SERVER_CMD``, a temporary data dir and config, and
   ``VLLM_OMNI_LAUNCHER_GPU_MEMORY_GB=24``, the GPU the TI2V template is written for).
2. Registration: ``/object_info`` has our nodes (``comfy_harness.OUR_NODES``) from
   ``custom_nodes.vllm-omni-launcher`` (README's install folder), the log has no import failure of
   the pack, the core nodes the templates use match
   ``tests/helpers/workflow_defs.py``'s description of them, and ``/workflow_templates`` lists
   exactly the shipped templates (not the API twins).
3. A real run: POSTs the TI2V text-to-video API twin (64x64, 5 frames, 2 steps) to ``/prompt``,
   waits for ``/history``, finds the MP4 that SaveVideo wrote in the output folder, fetches it
   through ``/view`` and decodes it (5 frames, 64x64, each frame carrying its index and the seed).
4. The browser: headless Chromium opens the ComfyUI page; each template is fetched from
   ``/api/workflow_templates/vllm-omni-launcher/<name>.json`` and loaded with
   ``app.loadGraphData`` (as the template browser does). No missing-node dialog, no node in
   error, no new console error, ``app.graphToPrompt()`` equals the API twin, and values typed
   into Generate video / batch (81 frames, 832x480, ...) stay what was typed. Then the template
   browser (Templates > vllm-omni-launcher) must show a card for each, and a click on one loads
   it. A control loads a graph with an unknown node type and expects the check to see the
   missing node. Screenshots (1280x800) go to ``--screenshots``; ``--thumbnails`` also
   writes ``workflows/<name>.jpg``, the card pictures the template browser asks for.

5. Caching (``behaviour_checks``): the TI2V twin (tiny, a fresh seed) queued twice sends one job
   to the stub (counted from upstream's ``"POST /v1/videos"`` access lines in the server log
   the launcher keeps in its data dir) and the second queue runs no node; then a changed seed
   sends exactly one more job, re-runs only Generate video and Save video, and the same server
   process serves it (its ``STUB_PID`` line; no new log file). The remote template against a
   stub started here: the same, counted in that stub's log.
6. The front end (headless Chromium): Doctor and Server Status queued from the page show their
   reports on the nodes (``send_progress_text`` -> the node's text preview widget); the TI2V
   template (320x192, 17 frames, 20 steps of 0.5 s) shows ``Step k/20`` and a moving progress
   bar on Generate video mid-denoise, then ``Done``: screenshot ``generate_mid_denoise.png``.
7. Cancel during a launch, in a second ComfyUI whose stub loads weights for 15 minutes:
   ``/interrupt`` 5 s after the server process appeared ends the prompt as interrupted in under
   3 s and leaves no process of the server's process group; then, queued from the page, the
   Local Server node shows its status text and progress while the stub loads: screenshot
   ``local_server_mid_launch.png`` (then Cancel).

Console errors of the stock front end itself are not counted, and every other one fails the
check, from startup on: offline it fails to reach the internet and to load optional files of a
fresh user folder (failed resources), and front end 1.27.10 throws one page error at startup even
with no custom node at all (``FRONTEND_OWN_ERRORS`` says what it is; the report lists it under
``frontend_own_errors``). A page error is the front end's only when it is one of those, thrown in
its own bundle; see ``browser_checks._new_errors``.

Generate Batch (a batch run and Cancel of all its jobs) has its own script, ``run_batch_comfyui.py``.

To refresh what is committed: ``--screenshots docs/screenshots --thumbnails``. ``--skip-behaviour``
runs steps 1-4 only; ``--skip-browser`` leaves out the browser parts.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shlex
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Optional

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "contract"))
sys.path.insert(0, str(HERE.parent / "helpers"))

from comfy_harness import (OUR_NODES, PACK_NAME, REPO, WORKFLOWS, ComfyUI, comfyui_version,  # noqa: E402
                           pack_import_problems)

try:   # the unit tests' description of the templates and core nodes needs the package importable
    import vllm_omni_launcher  # noqa: F401
except ImportError:            # not pip-installed: import this checkout under the package name
    _alias = Path(tempfile.mkdtemp(prefix="vllm-omni-launcher-import-"))
    (_alias / "vllm_omni_launcher").symlink_to(REPO, target_is_directory=True)
    sys.path.insert(0, str(_alias))

import behaviour_checks as bc  # noqa: E402
import node_display_checks as shown  # noqa: E402
import workflow_defs as wf  # noqa: E402
from browser_checks import check_templates_in_browser  # noqa: E402

EXPECTED_TEMPLATES = wf.EXPECTED_TEMPLATES

TEMPLATE = bc.TI2V_TEMPLATE
TINY = bc.TINY
LAUNCHER_DATA = "launcher-data"   # under the work folder: the launcher's logs, state and job storage
def launcher_env(work: Path, step_s: float = 0.05, load_delay_s: float = 0.0) -> dict[str, str]:
    """The local configuration that points the launcher at the stub server (never the workflow).

    ``step_s`` / ``load_delay_s``: the stub's seconds per denoise step and of weight loading
    (its ``VLLM_OMNI_STUB_*`` knobs, which reach it through the server's environment). The
    launcher's logs of that server land in ``<work>/launcher-data/logs`` (``LAUNCHER_DATA``).
    """
    import stubserver

    env = {
        "VLLM_OMNI_LAUNCHER_SERVER_CMD": shlex.join([stubserver.server_python(), stubserver.STUB_SCRIPT]),
        "VLLM_OMNI_LAUNCHER_DATA_DIR": str(work / LAUNCHER_DATA),
        "VLLM_OMNI_LAUNCHER_GPU_LOCK_DIR": str(work / "gpu-locks"),     # not the machine's: no real launcher met
        "VLLM_OMNI_LAUNCHER_CONFIG": str(work / "no-launcher-config.json"),
        "VLLM_OMNI_LAUNCHER_GPU_MEMORY_GB": "24",
        "VLLM_OMNI_STUB_STEP_S": f"{step_s:g}",
    }
    if load_delay_s:
        env["VLLM_OMNI_STUB_LOAD_DELAY_S"] = f"{load_delay_s:g}"
    return env


# --------------------------------------------------------------------------- 2. registration
def check_registration(comfy: ComfyUI) -> dict:
    info = comfy.get("/object_info")
    missing = [n for n in OUR_NODES if n not in info]
    assert not missing, f"nodes not registered: {missing}; log:\n{comfy.log()[-4000:]}"
    for node in OUR_NODES:
        assert info[node]["python_module"] == f"custom_nodes.{PACK_NAME}", info[node]["python_module"]
        assert info[node]["category"] == "vLLM-Omni"
    extra = sorted(k for k, v in info.items() if v.get("python_module") == f"custom_nodes.{PACK_NAME}"
                   and k not in OUR_NODES)
    assert not extra, f"unexpected nodes from the pack: {extra}"
    problems = pack_import_problems(comfy.log())
    assert not problems, "pack import failed:\n" + "\n".join(problems)
    assert f"custom_nodes/{PACK_NAME}" in comfy.log(), "the pack is not in ComfyUI's import-times list"

    # What ComfyUI tells the front end about our widgets = what the unit tests assume.
    defs = wf.node_defs()
    for node in OUR_NODES:
        ours = [(name, section) for name, _, section in defs[node].inputs]
        real = [(name, section) for section in ("required", "optional")
                for name in info[node]["input_order"].get(section, [])]
        assert ours == real, f"{node}: input order {real} != {ours}"
        assert tuple(info[node]["output"]) == defs[node].outputs
    # The core nodes' description in workflow_defs.py (CI has no ComfyUI) matches this ComfyUI.
    for node, core in wf.CORE_NODES.items():
        assert node in info, f"core node {node} missing"
        real_inputs = info[node]["input"]["required"]
        assert list(real_inputs) == list(core["input"]["required"]), (node, list(real_inputs))
        for name, spec in core["input"]["required"].items():
            kind, opts = spec
            real_kind, real_opts = real_inputs[name][0], (real_inputs[name][1] if len(real_inputs[name]) > 1 else {})
            if kind == "FILE":            # a file list with its upload button (image, video or audio)
                upload = next(key for key in ("image_upload", "video_upload", "audio_upload") if key in opts)
                real_options = real_kind if isinstance(real_kind, list) else real_opts.get("options")
                assert isinstance(real_options, list) and real_opts.get(upload), (node, name, real_inputs[name])
            elif isinstance(kind, list):
                real_options = real_kind if isinstance(real_kind, list) else real_opts.get("options")
                assert real_options == kind, (node, name, real_options)
            else:
                assert real_kind == kind, (node, name, real_kind)
        assert tuple(info[node]["output"]) == core["outputs"], (node, info[node]["output"])
        assert info[node]["display_name"] == core["display"], (node, info[node]["display_name"])

    templates = comfy.get("/workflow_templates")
    assert sorted(templates.get(PACK_NAME, [])) == sorted(wf.EXPECTED_TEMPLATES), templates
    return {"nodes": {n: info[n]["display_name"] for n in OUR_NODES}, "templates": sorted(templates[PACK_NAME])}


# --------------------------------------------------------------------------- 3. a real run
def check_generate(comfy: ComfyUI, keep_video: Optional[Path] = None, timeout: float = 900.0) -> dict:
    import av
    import numpy as np

    import frame_code

    prompt = wf.load(WORKFLOWS / "api" / f"{TEMPLATE}.api.json")
    gen_id = next(k for k, e in prompt.items() if e["class_type"] == "VLLMOmniGenerateVideo")
    save_id = next(k for k, e in prompt.items() if e["class_type"] == "SaveVideo")
    prompt[gen_id]["inputs"].update(TINY)
    seed = prompt[gen_id]["inputs"]["seed"]
    client_id = str(uuid.uuid4())
    status, body = comfy.post("/prompt", {"prompt": prompt, "client_id": client_id})
    assert status == 200 and not body.get("node_errors"), f"/prompt refused it: {status} {body}"
    started = time.monotonic()
    entry = comfy.wait_history(body["prompt_id"], timeout=timeout)
    elapsed = time.monotonic() - started
    st = entry["status"]
    assert st["status_str"] == "success" and st["completed"], \
        f"prompt failed: {json.dumps(st, indent=1)[:6000]}\nlog tail:\n{comfy.log()[-6000:]}"
    out = entry["outputs"].get(save_id, {})
    files = [f for f in out.get("images", []) + out.get("videos", []) if f["filename"].endswith(".mp4")]
    assert len(files) == 1, f"SaveVideo reported {out}"
    item = files[0]
    assert item["type"] == "output"
    on_disk = comfy.output_dir / item["subfolder"] / item["filename"]
    assert on_disk.is_file() and on_disk.stat().st_size > 0, on_disk
    data = comfy.get_bytes(comfy.view_url(item["filename"], item["subfolder"], item["type"]))
    assert data == on_disk.read_bytes(), "/view returned other bytes than the file in the output folder"
    assert data[4:8] == b"ftyp", "not an MP4"
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.video[0]
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(stream)]
        rate = float(stream.average_rate)
    assert len(frames) == TINY["frames"] and frames[0].shape == (TINY["height"], TINY["width"], 3)
    assert [frame_code.decode(f.astype(np.float32) / 255.0) for f in frames] == \
        [(i, seed % 256) for i in range(TINY["frames"])]
    kept = None
    if keep_video is not None:
        keep_video.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(on_disk, keep_video)
        kept = str(keep_video)
    texts = [m for m in st.get("messages", []) if m[0] in ("execution_error", "execution_interrupted")]
    assert not texts, texts
    return {"prompt_id": body["prompt_id"], "output": f"{item['subfolder']}/{item['filename']}",
            "bytes": len(data), "frames": len(frames), "size": f"{TINY['width']}x{TINY['height']}",
            "fps": rate, "seconds": round(elapsed, 1), "kept_copy": kept}


# --------------------------------------------------------------------------- main
def _started(comfy_dir: Path, python: str, work: Path, **stub_knobs: float) -> tuple[ComfyUI, bc.LauncherLogs]:
    comfy = ComfyUI(comfy_dir, python, launcher_env(work, **stub_knobs))
    comfy.wait_ready()
    return comfy, bc.LauncherLogs(work / LAUNCHER_DATA)


def _step(report: dict, name: str, value: Any) -> None:
    report[name] = value
    print(f"{name} ok:", json.dumps(value), flush=True)


def check_behaviour(comfy: ComfyUI, logs: bc.LauncherLogs, report: dict) -> None:
    """5. Caching: the same graph twice -> 1 job; a new seed -> 1 more job, same server process;
    the remote template the same against a stub started here."""
    _step(report, "same_graph_twice", bc.check_same_graph_twice(comfy, logs.jobs, bc.ti2v_prompt(seed=1001)))
    _step(report, "changed_seed", bc.check_changed_seed(comfy, logs.jobs, bc.ti2v_prompt(seed=2002),
                                                       bc.ti2v_prompt(seed=2003), server_pids=logs.server_pids))
    _step(report, "remote", bc.check_remote_requeue(comfy))


@contextlib.contextmanager
def comfy_instances(work: Path):
    """The ComfyUI processes a check run starts (append each to the yielded list): on an error their logs go
    to stderr; at the end every one is stopped and `work` removed."""
    started: list[ComfyUI] = []
    try:
        yield started
    except BaseException:
        for comfy in started:
            print(f"ComfyUI log ({comfy.log_path}):\n{comfy.log()[-8000:]}", file=sys.stderr)
        raise
    finally:
        for comfy in started:
            comfy.stop()
            comfy.cleanup()
        shutil.rmtree(work, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--comfyui-dir", default=os.environ.get("COMFYUI_DIR"))
    ap.add_argument("--python", default=os.environ.get("COMFYUI_PYTHON", sys.executable),
                    help="the python of ComfyUI's environment (default: this one)")
    ap.add_argument("--screenshots", type=Path, default=None,
                    help="folder for the screenshots (default: a temporary folder)")
    ap.add_argument("--thumbnails", action="store_true", help="also write workflows/<name>.jpg thumbnails")
    ap.add_argument("--keep-video", type=Path, default=None, help="copy the generated MP4 here")
    ap.add_argument("--skip-browser", action="store_true")
    ap.add_argument("--skip-behaviour", action="store_true", help="only steps 1-4")
    args = ap.parse_args()
    if not args.comfyui_dir:
        ap.error("set COMFYUI_DIR (a ComfyUI checkout with its requirements installed in --python)")
    comfy_dir = Path(args.comfyui_dir).expanduser().resolve()
    work = Path(tempfile.mkdtemp(prefix="vllm-omni-comfyui-check-"))
    shots = args.screenshots or (work / "screenshots")
    report: dict[str, Any] = {"comfyui": comfyui_version(comfy_dir), "comfyui_dir": str(comfy_dir)}
    with comfy_instances(work) as started:
        comfy, logs = _started(comfy_dir, args.python, work / "fast", step_s=bc.STEP_S)
        started.append(comfy)
        _step(report, "registration", check_registration(comfy))
        _step(report, "generate", check_generate(comfy, keep_video=args.keep_video))
        if not args.skip_behaviour:
            check_behaviour(comfy, logs, report)
        if not args.skip_browser:
            _step(report, "browser", check_templates_in_browser(comfy, shots, thumbnails=args.thumbnails))
            if not args.skip_behaviour:
                _step(report, "node_text", shown.check_text_nodes_in_browser(comfy, shots / shown.DOCTOR_PNG))
                _step(report, "mid_denoise", shown.screenshot_mid_denoise(comfy, shots / shown.MID_DENOISE_PNG))
        if not args.skip_behaviour:   # 6. Cancel during a launch, with a stub that loads for minutes
            slow, slow_logs = _started(comfy_dir, args.python, work / "slow", load_delay_s=bc.LOAD_DELAY_S)
            started.append(slow)
            _step(report, "interrupt_launch", bc.check_interrupt_during_launch(slow, slow_logs, seed=6006))
            if not args.skip_browser:
                _step(report, "mid_launch", shown.screenshot_mid_launch(slow, slow_logs, shots / shown.MID_LAUNCH_PNG))
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
