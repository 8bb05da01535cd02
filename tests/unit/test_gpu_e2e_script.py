"""The pure parts of the issue-15 GPU session driver (bench/gpu_comfyui_e2e.py, what it builds and reads in
bench/comfyui_e2e_reading.py, /proc reads in bench/comfyui_process.py): the API prompts it
queues, how it reads ComfyUI's websocket events, /history outputs and the server log, and the
report verdict. The driver itself is rehearsed end to end by `bash bench/gpu_session.sh cpu`."""
from __future__ import annotations

import importlib.util
import json
import struct
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _driver():
    spec = importlib.util.spec_from_file_location("gpu_comfyui_e2e", REPO / "bench" / "gpu_comfyui_e2e.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("gpu_comfyui_e2e", module)
    spec.loader.exec_module(module)
    return module


drv = _driver()             # the driver puts bench/ on sys.path: its helper modules import by name
import comfyui_e2e_reading as reading  # noqa: E402
import comfyui_process as process  # noqa: E402


def test_prompt_points_the_template_at_the_local_model_and_adds_probes():
    template = reading.load_api(reading.T2V)
    prompt = reading.build_prompt(template, "local/ti2v-5b", {"width": 1280, "height": 704, "frames": 121,
                                                          "steps": 8, "seed": 7}, {"compile": False})
    gen = reading.node_of(prompt, "VLLMOmniGenerateVideo")
    assert prompt[reading.node_of(prompt, "VLLMOmniLoadModel")]["inputs"]["model"] == "local/ti2v-5b"
    serving = prompt[reading.node_of(prompt, "VLLMOmniServingConfig")]["inputs"]
    assert serving["compile"] is False and serving["gpus"] == "auto" and serving["parallel_mode"] == "auto"
    assert {k: prompt[gen]["inputs"][k] for k in ("width", "height", "frames", "steps", "seed")} == \
        {"width": 1280, "height": 704, "frames": 121, "steps": 8, "seed": 7}
    assert prompt["90"] == {"class_type": "GetImageSize", "inputs": {"image": [gen, 0]}}
    assert [prompt[n]["inputs"]["source"] for n in ("91", "92", "93", "94")] == \
        [["90", 0], ["90", 1], ["90", 2], [gen, 1]]
    assert prompt["96"]["class_type"] == "SaveImage" and prompt["96"]["inputs"]["images"] == ["95", 0]
    assert template[gen]["inputs"]["width"] == 0, "the template itself is left unchanged"


def test_i2v_prompt_keeps_the_start_image():
    prompt = reading.build_prompt(reading.load_api(reading.I2V), "local/x", {"seed": 1}, probes=False)
    image = prompt[reading.node_of(prompt, "VLLMOmniGenerateVideo")]["inputs"]["image"]
    assert prompt[image[0]]["class_type"] == "LoadImage" and "90" not in prompt


def test_probe_values_read_preview_any_text():
    outputs = {"91": {"text": ["1280"]}, "92": {"text": ["704"]}, "93": {"text": ["121"]}, "94": {"text": ["24.0"]}}
    assert reading.probe_values(outputs) == {"width": 1280.0, "height": 704.0, "batch": 121.0, "fps": 24.0}
    assert reading.probe_values({"91": {"text": ["None"]}})["width"] is None


def test_server_log_jobs_and_times():
    log = ('(APIServer pid=9) INFO:     127.0.0.1:1 - "POST /v1/videos HTTP/1.1" 200 OK\n'
           "(APIServer pid=9) INFO 11-30 [stats.py:874] | stage_gen_time_ms               | 538.299 |\n"
           "(APIServer pid=9) INFO 11-30 [serving_video.py:347] Video response encoding (MP4 bytes): 21.92 ms\n"
           '\x1b[32m(APIServer pid=9) INFO:     127.0.0.1:2 - "POST /v1/videos HTTP/1.1" 400 Bad\x1b[0m\n')
    assert reading.count_jobs(log) == 2
    assert reading.server_times(log) == [{"stage_gen_s": 0.538299, "mp4_encode_s": 0.02192, "server_s": 0.5602}]


def test_websocket_events_summarized_per_node():
    events = [
        {"type": "text", "node": "5", "text": "Checking the request"},
        {"type": "progress", "data": {"node": "5", "value": 1, "max": 8}},
        {"type": "text", "node": "5", "text": "Step 1/8, 2s elapsed"},
        {"type": "text", "node": "4", "text": "Ready"},
        {"type": "progress", "data": {"node": "5", "value": 8, "max": 8}},
        {"type": "text", "node": "5", "text": "Step 7/8, 17s elapsed"},
        {"type": "text", "node": "5", "text": "Done: 121 frames 1280x704 at 24 fps in 30.1s"},
    ]
    got = reading.summarize_progress(events, "5")
    assert got == {"progress_events": 2, "progress_last": [8, 8], "texts": 4, "first_text": "Checking the request",
                   "last_text": "Done: 121 frames 1280x704 at 24 fps in 30.1s", "denoise_steps_seen": [1, 7]}


def test_a_v3_nodes_bar_is_read_from_progress_state_events():
    def state(**nodes):
        return {"type": "progress_state", "data": {"prompt_id": "a", "nodes": {
            n: {"value": v, "max": m, "state": s, "node_id": n} for n, (v, m, s) in nodes.items()}}}
    events = [state(**{"5": (0, 1, "running")}), state(**{"5": (3, 8, "running")}),
              state(**{"4": (1, 1, "finished"), "5": (3, 8, "running")}),
              state(**{"5": (8, 8, "finished")}), state(**{"5": (8, 8, "finished"), "9": (0, 1, "running")})]
    got = reading.summarize_progress(events, "5")
    assert (got["progress_events"], got["progress_last"]) == (3, [8, 8])


def test_executed_and_cached_nodes_of_one_prompt():
    events = [
        {"type": "execution_cached", "data": {"prompt_id": "a", "nodes": ["2", "3", "4"]}},
        {"type": "executing", "data": {"prompt_id": "a", "node": "5"}},
        {"type": "executing", "data": {"prompt_id": "b", "node": "4"}},
        {"type": "executing", "data": {"prompt_id": "a", "node": None}},
    ]
    assert reading.executed_nodes(events, "a") == (["5"], ["2", "3", "4"])


def test_binary_text_event_decoded():
    raw = struct.pack(">I", reading.TEXT_EVENT) + struct.pack(">I", 1) + b"5" + "Step 3/40".encode()
    assert reading.binary_event(raw) == {"type": "text", "data": {}, "node": "5", "text": "Step 3/40"}
    assert reading.binary_event(struct.pack(">I", 1) + b"\x00" * 8)["type"] == "binary1"


def test_verdict_fails_on_a_failed_or_skipped_check():
    ok = reading.verdict({"checks": {"t2v": {"ok": True}, "kill": {"ok": True}}})
    assert ok["all_ok"] is True and ok["failed"] == []
    bad = reading.verdict({"checks": {"t2v": {"ok": True}, "cancel": {"ok": False}}})
    assert bad["all_ok"] is False and bad["failed"] == ["cancel"]
    skipped = reading.verdict({"checks": {"t2v": {"ok": True}, "kill": {"ok": None, "skipped": "time"}}})
    assert skipped["all_ok"] is False and skipped["failed"] == []
    assert reading.verdict({"checks": {}})["all_ok"] is False
    json.dumps(skipped)


def test_arguments_default_to_the_full_ti2v_5b_shape_with_every_check():
    args = drv.parse_args(["--comfy-dir", "c", "--base", "b", "--model-folder", "m", "--out", "o"])
    assert (args.width, args.height, args.frames, args.steps, args.expect_fps) == (1280, 704, 121, 8, 24.0)
    assert args.checks == {"t2v", "cached", "i2v", "cancel", "kill"} and not args.cpu and not args.eager


def test_server_env_var_reads_one_name_only():
    import os
    import subprocess

    # The child says when it runs, so its environment is read from the exec'd python, never mid-start.
    child = subprocess.Popen([sys.executable, "-c", "import time; print('up', flush=True); time.sleep(30)"],
                             env={**os.environ, "GPU_E2E_PROBE": "backend:cudaMallocAsync"},
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "up"
        assert process.server_env_var(child.pid, "GPU_E2E_PROBE") == "backend:cudaMallocAsync"
        assert process.server_env_var(child.pid, "GPU_E2E_PROBE_NOT_SET") is None
    finally:
        child.kill()
        child.wait()
    assert process.server_env_var(child.pid, "PATH") is None   # reaped: no such process
