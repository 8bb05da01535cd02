"""The pack inside a real ComfyUI, as pytest tests (run_real_comfyui.py, behaviour_checks.py).

These run only when COMFYUI_DIR names a ComfyUI checkout (CI has none; they are skipped
with that reason). ComfyUI runs under COMFYUI_PYTHON (default: this python), which needs
ComfyUI's requirements and ours; the browser tests need the `playwright` package and a
system Chromium (CHROMIUM or chromium on PATH). The stub server python comes from
VLLM_OMNI_LAUNCHER_TEST_SERVER_PYTHON, as for the other stub tests. Screenshots go to a
temporary folder, or to COMFYUI_SCREENSHOTS (e.g. docs/screenshots) when set.

COMFYUI_OLD_DIR (optional) names a ComfyUI older than the one the V3 nodes need (e.g. 0.3.47, before
comfy_api.v0_0_2, or 0.3.60): it must log one line naming the ComfyUI needed and register no node.

Two ComfyUI processes: one whose stub server starts quickly (0.5 s per denoise step) for
the runs, caching and the front end; one whose stub spends minutes loading weights, for
Cancel during a launch.
"""
from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

COMFYUI_DIR = os.environ.get("COMFYUI_DIR", "").strip()
if not COMFYUI_DIR:
    pytest.skip("COMFYUI_DIR is not set: the real-ComfyUI tests need a ComfyUI checkout with its requirements "
                "in this python (e.g. COMFYUI_DIR=/path/to/ComfyUI python -m pytest tests/comfyui; "
                "see tests/comfyui/run_real_comfyui.py)", allow_module_level=True)

import behaviour_checks as bc  # noqa: E402
import node_display_checks as shown  # noqa: E402
import browser_checks  # noqa: E402
import run_batch_comfyui as batch  # noqa: E402
import run_real_comfyui as real  # noqa: E402
from comfy_harness import OUR_NODES, PACK_NAME, ComfyUI  # noqa: E402

OLD_COMFYUI_DIR = os.environ.get("COMFYUI_OLD_DIR", "").strip()


def _comfyui(work: Path, **stub_knobs: float) -> Iterator[tuple[ComfyUI, bc.LauncherLogs]]:
    server = ComfyUI(Path(COMFYUI_DIR), os.environ.get("COMFYUI_PYTHON", sys.executable),
                     real.launcher_env(work, **stub_knobs))
    try:
        server.wait_ready()
        yield server, bc.LauncherLogs(work / real.LAUNCHER_DATA)
    finally:
        server.stop()
        server.cleanup()
        shutil.rmtree(work, ignore_errors=True)


@pytest.fixture(scope="module")
def comfy_and_logs() -> Iterator[tuple[ComfyUI, bc.LauncherLogs]]:
    yield from _comfyui(Path(tempfile.mkdtemp(prefix="vllm-omni-comfyui-test-")), step_s=bc.STEP_S)


@pytest.fixture(scope="module")
def comfy(comfy_and_logs) -> ComfyUI:
    return comfy_and_logs[0]


@pytest.fixture(scope="module")
def logs(comfy_and_logs) -> bc.LauncherLogs:
    return comfy_and_logs[1]


@pytest.fixture(scope="module")
def slow_launch() -> Iterator[tuple[ComfyUI, bc.LauncherLogs]]:
    yield from _comfyui(Path(tempfile.mkdtemp(prefix="vllm-omni-comfyui-slow-")), load_delay_s=bc.LOAD_DELAY_S)


@pytest.fixture(scope="module")
def screenshots(tmp_path_factory) -> Path:
    chosen = os.environ.get("COMFYUI_SCREENSHOTS", "").strip()
    return Path(chosen).resolve() if chosen else tmp_path_factory.mktemp("screenshots")


def test_comfyui_registers_our_nodes_without_import_failure(comfy):
    report = real.check_registration(comfy)
    assert sorted(report["nodes"]) == sorted(OUR_NODES)


def test_a_model_this_machine_lacks_is_refused_at_prompt_time_with_the_launchers_message(comfy, logs):
    # V3 combos are not checked against their list by ComfyUI itself: validate_inputs does it (nodes/schema.py)
    prompt = bc.ti2v_prompt(seed=909)
    load = bc.node_of(prompt, "VLLMOmniLoadModel")
    prompt[load]["inputs"]["model"] = "local/not-on-this-machine"
    jobs = logs.jobs()
    status, body = comfy.post("/prompt", {"prompt": prompt, "client_id": "v3-validate"})
    errors = body.get("node_errors", {}).get(load, {}).get("errors", [])
    assert status == 400 and errors, (status, body)
    assert all(e["type"] == "custom_validation_failed" and e["extra_info"]["input_name"] == "model" for e in errors)
    assert "not one of Load Model's choices on this machine" in errors[0]["details"], errors
    assert logs.jobs() == jobs                                # nothing ran, nothing was sent


def test_a_missing_lora_is_refused_once_under_lora_name_only(comfy, logs):
    # ComfyUI attaches validate_inputs' one message to every input its signature names (nodes/v3.py)
    prompt = bc.load_api("wan22_t2v_a14b_4step_lora")          # its LoRA files are not on this machine
    loras = [k for k, e in prompt.items() if e["class_type"] == "VLLMOmniLora"]
    jobs = logs.jobs()
    status, body = comfy.post("/prompt", {"prompt": prompt, "client_id": "v3-validate-lora"})
    assert status == 400 and len(loras) == 2, (status, body)
    for lora in loras:
        errors = body.get("node_errors", {}).get(lora, {}).get("errors", [])
        assert [e["extra_info"]["input_name"] for e in errors] == ["lora_name"], errors
        assert errors[0]["details"].startswith("lora_name - "), errors
        assert '"wan2.2_t2v_lightx2v_4steps' in errors[0]["details"], errors      # (shortened in the message)
    assert logs.jobs() == jobs


def test_generate_batch_is_registered_with_a_list_of_videos(comfy):
    report = batch.check_registration(comfy)
    assert report["output_is_list"] == [False, False, True, False]


def test_ti2v_text_to_video_template_makes_a_video_in_comfyuis_output_folder(comfy):
    report = real.check_generate(comfy)
    assert report["frames"] == real.TINY["frames"] and report["bytes"] > 0


def test_generate_video_sends_each_denoise_step_to_the_websocket_as_the_nodes_bar(comfy):
    """ComfyUI 0.3.64 sends a V3 node's set_progress as `progress_state` only (no `progress`); the bench's
    reader (bench/comfyui_e2e_reading.py) must see the steps in what the browser gets."""
    sys.path.insert(0, str(HERE.parents[1] / "bench"))
    from comfyui_e2e_reading import bar_positions
    from comfyui_process import Websocket
    client_id, steps = f"progress-{os.getpid()}", 6
    ws = Websocket(comfy.url, client_id)
    try:
        prompt = bc.ti2v_prompt(seed=4004, steps=steps)
        bc.run_queued(comfy, comfy.queue(prompt, client_id))
        bars = bar_positions(ws.snapshot(), bc.node_of(prompt, "VLLMOmniGenerateVideo"))
    finally:
        ws.close()
    assert [b for b in bars if b[1] == steps and 0 < b[0] < steps] and bars[-1] == [steps, steps], bars


def test_the_same_local_graph_queued_twice_sends_one_job(comfy, logs):
    report = bc.check_same_graph_twice(comfy, logs.jobs, bc.ti2v_prompt(seed=1001))
    assert report["jobs"] == 1


def test_a_changed_seed_sends_one_more_job_to_the_same_server_process(comfy, logs):
    report = bc.check_changed_seed(comfy, logs.jobs, bc.ti2v_prompt(seed=2002), bc.ti2v_prompt(seed=2003),
                                   server_pids=logs.server_pids)
    assert report["jobs_for_both"] == 2


def test_the_same_remote_graph_queued_twice_sends_one_job_and_a_new_seed_one_more(comfy):
    report = bc.check_remote_requeue(comfy)
    assert report["same_graph_twice"]["jobs"] == 1 and report["changed_seed"]["jobs_for_both"] == 2


def test_doctor_and_server_status_reports_appear_on_their_nodes_in_the_browser(comfy):
    report = shown.check_text_nodes_in_browser(comfy)
    assert shown.DOCTOR_DONE.search(report["doctor_text"])


def test_every_template_loads_in_the_browser_without_missing_nodes_or_errors(comfy, tmp_path):
    report = browser_checks.check_templates_in_browser(comfy, tmp_path / "screenshots")
    assert report["template_browser"]["cards"] == sorted(real.EXPECTED_TEMPLATES)


def test_every_released_ui_workflow_loads_in_the_browser_as_its_released_api_twin(comfy):
    report = browser_checks.check_released_in_browser(comfy)
    assert sorted(report) == sorted(p.stem for p in real.wf.RELEASED.glob("*.json") if ".api." not in p.name)


def test_generate_shows_its_denoise_step_and_progress_in_the_browser(comfy, screenshots):
    report = shown.screenshot_mid_denoise(comfy, screenshots / shown.MID_DENOISE_PNG)
    assert shown.STEP_TEXT.search(report["text"])


def test_generate_batch_returns_every_clip_and_save_video_saves_each(comfy, logs):
    report = batch.check_batch_run(comfy, logs)
    assert report["clips"] == report["jobs_sent"] == 4 and report["frames_saved"] == 4 * bc.TINY["frames"]


def test_interrupting_a_batch_deletes_every_job_on_the_server(comfy, logs):
    # 20 steps at the stub's 0.5 s: still running after its jobs are in, and the cancelled one drains
    report = batch.check_cancel(comfy, logs, steps=20)
    assert report["jobs_deleted"] == 4


def test_interrupt_during_a_local_server_launch_ends_the_prompt_and_the_server(slow_launch):
    comfy, logs = slow_launch
    report = bc.check_interrupt_during_launch(comfy, logs, seed=6006)
    assert report["prompt_ended_s"] < bc.CANCEL_BOUND_S


def test_local_server_shows_status_and_progress_in_the_browser_while_it_launches(slow_launch, screenshots):
    comfy, logs = slow_launch
    report = shown.screenshot_mid_launch(comfy, logs, screenshots / shown.MID_LAUNCH_PNG)
    assert report["text"] and report["progress"]


@pytest.mark.skipif(not OLD_COMFYUI_DIR, reason="COMFYUI_OLD_DIR (a ComfyUI older than the pack needs) is not set")
def test_a_comfyui_too_old_for_the_v3_nodes_logs_one_line_and_registers_no_node(tmp_path):
    old = ComfyUI(Path(OLD_COMFYUI_DIR), os.environ.get("COMFYUI_PYTHON", sys.executable), real.launcher_env(tmp_path))
    try:
        old.wait_ready()
        registered = [name for name in old.get("/object_info") if name.startswith("VLLMOmni")]
        log = old.log()
    finally:
        old.stop()
        old.cleanup()
    lines = [line for line in log.splitlines() if "vLLM-Omni Launcher needs ComfyUI" in line]
    assert registered == [] and len(lines) == 1 and "0.3.64 or newer" in lines[0], (registered, lines)
    assert "Traceback" not in log and f"custom_nodes/{PACK_NAME}" in log      # imported, no half-registration


def test_prestart_last_server_starts_the_last_local_server_with_comfyui_and_the_first_prompt_reuses_it(tmp_path):
    """A ComfyUI runs the TI2V template (Local Server records its choices); a second ComfyUI on the same data
    dir with `prestart_last_server` on starts that server while it loads the pack, and its first prompt runs
    on it: no server start of its own."""
    import time

    work = tmp_path / "prestart"
    env = real.launcher_env(work, step_s=0.05)
    logs = bc.LauncherLogs(work / real.LAUNCHER_DATA)
    first = ComfyUI(Path(COMFYUI_DIR), os.environ.get("COMFYUI_PYTHON", sys.executable), env)
    try:
        first.wait_ready()
        bc.run_to_success(first, bc.ti2v_prompt(seed=7007))
    finally:
        first.stop()
        first.cleanup()
    assert (work / real.LAUNCHER_DATA / "last_local_server.json").is_file()
    second = ComfyUI(Path(COMFYUI_DIR), os.environ.get("COMFYUI_PYTHON", sys.executable),
                     dict(env, VLLM_OMNI_LAUNCHER_PRESTART_LAST_SERVER="1"))
    try:
        second.wait_ready()
        deadline = time.monotonic() + 300     # the stub's start, announced by the pack's "ready" line
        while "prestart_last_server: ready at" not in second.log():
            assert "prestart_last_server: failed" not in second.log(), second.log()[-4000:]
            assert time.monotonic() < deadline, second.log()[-4000:]
            time.sleep(0.5)
        assert "prestart_last_server: starting" in second.log()
        pids = logs.server_pids()
        jobs = logs.jobs()
        bc.run_to_success(second, bc.ti2v_prompt(seed=8008))
        assert logs.jobs() == jobs + 1
        assert logs.server_pids() == pids, "the first prompt started a server of its own"
    finally:
        second.stop()
        second.cleanup()
