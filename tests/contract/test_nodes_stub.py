"""The node layer end to end, without ComfyUI: a stand-in for ComfyUI's progress, interrupt and
status hooks (comfy_standin.py), our nodes, our supervisor and the stub server (real
vLLM-Omni HTTP layer, fake engine), pointed at by local configuration (environment).
"""
from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import psutil
import pytest
import requests

import frame_code
from comfy_standin import ComfyStandIn, InterruptProcessingException, run_node
from cancel_latency import LAUNCH_CANCEL_S
from stubserver import STUB_SCRIPT, server_python, wait_for
from processes import alive, assert_no_process_left, stub_pids
from vllm_omni_launcher.nodes import NODES
from vllm_omni_launcher.errors import LauncherError
from vllm_omni_launcher.nodes.handles import ServerHandle
from vllm_omni_launcher.server.logs import failures
from vllm_omni_launcher.server import registry as supervisor
from vllm_omni_launcher.server.logs.failures import ServerFailure
from vllm_omni_launcher.server.process import process_group
from vllm_omni_launcher.server.process.log_files import logs_dir
from vllm_omni_launcher.server.supervision.status import LOADING

TI2V = "Wan-AI/Wan2.2-TI2V-5B-Diffusers"


def _serving(**overrides):
    values = dict(gpus="all", parallel_mode="none", parallel_degree=1, vae_patch_parallel=1, offload="none",
                  fp8=False, vae_tiling=False, cache_backend="none", compile=False, keep_alive_minutes=0,
                  auto_fallback=False)
    values.update(overrides)
    return run_node("VLLMOmniServingConfig", **values)[0]


def _generate(handle, **overrides):
    values = dict(server=handle, prompt="a fox in the snow", negative_prompt="", width=64, height=64, frames=9,
                  fps=12.0, steps=3, guidance=-1.0, guidance_2=-1.0, boundary_ratio=-1.0, flow_shift=-1.0,
                  seed=5, unique_id="gen")
    values.update(overrides)
    return run_node("VLLMOmniGenerateVideo", **values)


class _Env:
    """os.environ changes for a module-scoped server (monkeypatch is function scoped)."""

    def __init__(self, **values: str) -> None:
        self.values, self.saved = values, {}

    def __enter__(self):
        for k, v in self.values.items():
            self.saved[k] = os.environ.get(k)
            os.environ[k] = v
        return self

    def __exit__(self, *exc):
        for k, v in self.saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _fresh_launcher(tmp_path, monkeypatch, **stub_env: str) -> None:
    """No server of ours running, the stub as the server program, and these environment values."""
    supervisor.stop_all()
    monkeypatch.setenv("VLLM_OMNI_LAUNCHER_SERVER_CMD", f"{server_python()} {STUB_SCRIPT}")
    monkeypatch.setenv("VLLM_OMNI_LAUNCHER_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("VLLM_OMNI_LAUNCHER_GPU_MEMORY_GB", "80")   # the stub's GPU: NVML may show none here
    for key, value in stub_env.items():
        monkeypatch.setenv(key, value)


def _in_thread(work) -> tuple[threading.Thread, dict]:
    """Run a node call in a worker thread (as ComfyUI does); result["exc"] is what it raised."""
    result: dict = {}

    def run() -> None:
        try:
            work()
        except BaseException as exc:  # noqa: BLE001 - the test inspects it
            result["exc"] = exc

    worker = threading.Thread(target=run)
    worker.start()
    return worker, result


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    data = tmp_path_factory.mktemp("nodes-data")
    with _Env(VLLM_OMNI_LAUNCHER_SERVER_CMD=f"{server_python()} {STUB_SCRIPT}",
              VLLM_OMNI_LAUNCHER_DATA_DIR=str(data), VLLM_OMNI_STUB_STEP_S="0.1",
              VLLM_OMNI_LAUNCHER_GPU_MEMORY_GB="80"), ComfyStandIn() as comfy:
        model = run_node("VLLMOmniLoadModel", TI2V)[0]
        handle = run_node("VLLMOmniLocalServer", model, _serving(), unique_id="srv")[0]
        try:
            yield handle, comfy
        finally:
            supervisor.stop_all()


RELEASED_NODES = {"VLLMOmniLoadModel", "VLLMOmniServingConfig", "VLLMOmniLora", "VLLMOmniLocalServer",
                  "VLLMOmniRemoteServer", "VLLMOmniGenerateVideo", "VLLMOmniGenerateBatch", "VLLMOmniStopServer",
                  "VLLMOmniServerStatus", "VLLMOmniDoctor"}


def test_the_released_nodes_keep_their_ids_and_every_node_has_the_prefix_inputs_and_outputs():
    assert RELEASED_NODES <= set(NODES) and all(k.startswith("VLLMOmni") and NODES[k].node_id == k for k in NODES)
    for node in NODES.values():
        assert isinstance(node.inputs(), list) and node.outputs and node.display_name.startswith("vLLM-Omni ")


def test_local_server_handle_is_small_and_secret_free(local):
    handle, comfy = local
    sup = supervisor.find(handle.server_id)
    assert handle.kind == "local" and handle.url == sup.url and handle.family_key == "ti2v_5b"
    assert sup.api_key and sup.api_key not in repr(handle) and sup.api_key not in str(vars(handle))
    assert any("ready" in text.lower() for text, node in comfy.texts if node == "srv")


def test_generate_returns_image_fps_and_video_with_real_progress(local):
    handle, comfy = local
    comfy.progress.clear()
    image, fps, video = _generate(handle)
    assert tuple(image.shape) == (9, 64, 64, 3) and str(image.dtype) == "torch.float32"
    assert fps == 12.0
    assert [frame_code.decode(f) for f in image.numpy()] == [(i, 5) for i in range(9)]
    assert video.data[4:8] == b"ftyp"          # the server's MP4, untouched
    assert comfy.progress and comfy.progress[-1] == (3, 3)     # real denoise steps from the server log
    assert any(text.startswith("Done: 9 frames 64x64") for text, _ in comfy.texts)


def test_a_local_job_gets_the_worker_side_mp4_and_the_server_does_not_encode_again(local):
    """The launcher's job to a 0.30 server it started carries extra_params.preencode_mp4 (worker_mp4.py):
    the stub's worker encodes the MP4 as the real Wan pipeline does, and upstream's API layer passes the
    bytes on (its log says so) instead of encoding the frames; the node decodes the same frames from them."""
    handle, _ = local
    log = Path(supervisor.find(handle.server_id).log_path)
    start = len(log.read_text(errors="replace"))
    image, fps, video = _generate(handle, seed=6)
    assert [frame_code.decode(f) for f in image.numpy()] == [(i, 6) for i in range(9)] and fps == 12.0
    assert video.data[4:8] == b"ftyp"
    new = wait_for(lambda: (lambda text: text if "pre-encoded MP4 bytes" in text else None)(
        log.read_text(errors="replace")[start:]), 60, "the server's pre-encoded MP4 line")
    assert "Video response encoding (MP4" not in new


def test_model_defaults_fill_zero_widgets(local):
    handle, _ = local
    with pytest.raises(LauncherError) as err:
        _generate(handle, width=0, height=0, frames=10)      # 1280x704 default, but 10 frames is not 4k+1
    assert err.value.setting == "frames" and "set frames to 9" in str(err.value)


def test_invalid_requests_fail_before_any_http(local):
    handle, _ = local
    with pytest.raises(LauncherError) as err:
        _generate(handle, width=100)
    assert "multiple of 32" in str(err.value) and "96" in err.value.fix
    i2v = ServerHandle("remote", "http://127.0.0.1:9", "wan", "i2v_a14b")   # nothing listens there
    with pytest.raises(LauncherError) as err:
        _generate(i2v, width=832, height=480, frames=81)
    assert "needs a start image" in str(err.value)


def test_remote_server_with_key_from_local_config(local, monkeypatch):
    handle, comfy = local
    sup = supervisor.find(handle.server_id)
    with pytest.raises(LauncherError) as err:                 # no key configured for this origin
        run_node("VLLMOmniRemoteServer", handle.url, "ti2v_5b")
    assert "requires an API key" in err.value.what
    # The operator names the server and its key (the environment's pair is the server "env").
    monkeypatch.setenv("VLLM_OMNI_LAUNCHER_REMOTE_URL", handle.url)
    monkeypatch.setenv("VLLM_OMNI_LAUNCHER_REMOTE_API_KEY", sup.api_key)
    by_url = run_node("VLLMOmniRemoteServer", handle.url + "/v1", "ti2v_5b")[0]
    remote = run_node("VLLMOmniRemoteServer", "", "ti2v_5b", "env")[0]
    assert by_url.url == remote.url == handle.url and remote.remote_name == "env"
    assert remote.kind == "remote" and remote.served_name == TI2V and sup.api_key not in repr(remote)
    comfy.texts.clear()
    image, fps, _ = _generate(remote, seed=7, frames=5)
    assert [frame_code.decode(f)[1] for f in image.numpy()] == [7] * 5
    texts = [t for t, node in comfy.texts if node == "gen"]
    assert texts[0] == "Checking the request" and texts[-1].startswith("Done: 5 frames 64x64")
    assert any(t.startswith("Running ") and "no estimate yet" in t for t in texts)
    comfy.texts.clear()
    _generate(remote, seed=8, frames=5)                       # the second job has an estimate
    assert any("estimated from earlier jobs" in t or "longer than the" in t for t, _ in comfy.texts)


def test_a_failure_replaces_the_last_runs_done_text(local):
    handle, comfy = local
    _generate(handle, frames=5)
    assert comfy.texts[-1][0].startswith("Done: ")
    with pytest.raises(LauncherError):
        _generate(handle, frames=10)
    assert comfy.texts[-1] == ("Failed: frames 10 is not valid for Wan2.2", "gen")


def test_cancel_of_a_remote_job_explains_what_the_server_still_does(local, monkeypatch):
    handle, comfy = local
    sup = supervisor.find(handle.server_id)
    monkeypatch.setenv("VLLM_OMNI_LAUNCHER_REMOTE_URL", handle.url)
    monkeypatch.setenv("VLLM_OMNI_LAUNCHER_REMOTE_API_KEY", sup.api_key)
    remote = run_node("VLLMOmniRemoteServer", "", "ti2v_5b", "env")[0]
    comfy.texts.clear()
    worker, result = _in_thread(lambda: _generate(remote, steps=30, frames=5))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not any(t.startswith("Running") for t, _ in comfy.texts):
        time.sleep(0.05)
    comfy.interrupt.set()
    worker.join(30)
    assert isinstance(result.get("exc"), InterruptProcessingException)
    assert comfy.texts[-1][0].startswith("Cancelled and deleted on the remote server")
    assert not comfy.interrupt.is_set()                      # ComfyUI's flag was consumed by the node
    sup.wait_ready(timeout=60)


def test_generate_starts_a_stopped_local_server_again_without_rerunning_local_server(local):
    """Keep-alive or Stop Server ended the process; the cached Local Server handle still works:
    Generate Video finds no live server for its fingerprint and starts it again."""
    handle, comfy = local
    before = supervisor.find(handle.server_id)
    assert supervisor.stop(handle.server_id) and not before.alive()
    comfy.texts.clear()
    image, _, _ = _generate(handle, frames=5, seed=9)
    assert [frame_code.decode(f)[1] for f in image.numpy()] == [9] * 5
    texts = [t for t, node in comfy.texts if node == "gen"]
    assert any("starting it again" in t for t in texts) and texts[-1].startswith("Done: ")
    again = supervisor.find(handle.server_id)
    assert again is not None and again.ready()


def test_status_node_reports_the_server(local):
    handle, comfy = local
    live = supervisor.find(handle.server_id)          # after the restart above: a new port, same handle
    out = run_node("VLLMOmniServerStatus", server=handle, unique_id="status")
    # one statement: where it runs, its phase (the ready text's repeat of model and URL left out), its log
    assert live.log_path and out[0] == f"{TI2V} on all visible GPUs at {live.url}: Ready; log: {live.log_path}"
    assert comfy.texts[-1] == (out[0], "status")


def test_server_text_goes_to_the_node_whose_run_launches_it_never_to_an_ended_runs_id(local):
    """ComfyUI's node ids are small integers every graph reuses. Once a Local Server run has ended,
    the server's later status (a Stop Server here; a keep-alive stop or a crash alike) is sent to no
    node: the user's report was a prompt holding only Stop Server, as node 1, whose stop wrote
    "Stopping the server" under node 4 of the open graph. A later run's node that reuses the server
    hears its status while it runs."""
    handle, comfy = local
    model = run_node("VLLMOmniLoadModel", TI2V)[0]
    sup = supervisor.find(handle.server_id)
    comfy.texts.clear()
    again = run_node("VLLMOmniLocalServer", model, _serving(), unique_id="4")[0]     # a later prompt's node
    assert again.server_id == handle.server_id and supervisor.find(again.server_id) is sup
    assert (sup.status().text, "4") in comfy.texts and {node for _, node in comfy.texts} == {"4"}
    comfy.texts.clear()
    report = run_node("VLLMOmniStopServer", False, handle, unique_id="1")[0]        # the stop runs on this thread
    assert not sup.alive() and sup.status().text == "Stopped"
    assert comfy.texts == [(report, "1")], "the stop's status reached a node of an ended run"


def test_cancel_while_local_server_starts_ends_the_launch_at_once(tmp_path, monkeypatch):
    """Cancel once the launch is loading weights (the stub 'loads' for 120 s): the node ends as
    interrupted as promptly as a cancelled start promises, says so, and leaves no server process."""
    _fresh_launcher(tmp_path, monkeypatch, VLLM_OMNI_STUB_LOAD_DELAY_S="120")
    with ComfyStandIn() as comfy:
        model = run_node("VLLMOmniLoadModel", TI2V)[0]
        worker, result = _in_thread(
            lambda: run_node("VLLMOmniLocalServer", model, _serving(), unique_id="srv"))
        try:
            loading = wait_for(lambda: [s for s in supervisor.all_servers() if s.status().phase == LOADING], 120,
                               "the launch to reach the stub's weight loading")
            pgid = loading[0].pgid
            cancelled_at = time.monotonic()
            comfy.interrupt.set()
            worker.join(60)
            took = time.monotonic() - cancelled_at
            assert not worker.is_alive() and isinstance(result.get("exc"), InterruptProcessingException), result
            assert took < LAUNCH_CANCEL_S, f"the launch ended {took:.1f} s after Cancel"
            assert comfy.texts[-1] == ("Cancelled while starting: the server and all its processes were stopped",
                                       "srv")
            assert not any(s.alive() for s in supervisor.all_servers())
            assert pgid is not None and process_group.group_members(pgid) == [], "the server's group is gone"
            assert not any(alive(p) for p in stub_pids(tmp_path))
        finally:
            supervisor.stop_all()


def test_cancel_deletes_the_job_and_restarts_a_server_still_busy(tmp_path, monkeypatch):
    """Cancel while running: DELETE at once, node ends as interrupted; the stub (like upstream)
    keeps denoising, so the supervisor's hard cancel restarts the server to free the GPU."""
    _fresh_launcher(tmp_path, monkeypatch, VLLM_OMNI_STUB_HANG_IN_JOB="1")
    with ComfyStandIn() as comfy:
        model = run_node("VLLMOmniLoadModel", TI2V)[0]
        handle = run_node("VLLMOmniLocalServer", model, _serving(), unique_id="srv")[0]
        sup = supervisor.find(handle.server_id)
        try:
            generation, busy_pid = sup.generation, sup.status().pid
            worker, result = _in_thread(lambda: _generate(handle, steps=20))
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and not any(t.startswith("Step") for t, _ in comfy.texts):
                time.sleep(0.05)
            assert any(t.startswith("Step") for t, _ in comfy.texts), comfy.texts
            comfy.interrupt.set()
            worker.join(60)
            assert isinstance(result.get("exc"), InterruptProcessingException)
            jobs = requests.get(f"{handle.url}/v1/videos", headers={"Authorization": f"Bearer {sup.api_key}"},
                                timeout=10).json()
            assert jobs["data"] == []                       # the job record is gone
            deadline = time.monotonic() + 300     # hard cancel waits a grace period, then restarts
            while time.monotonic() < deadline and sup.generation == generation:
                time.sleep(0.2)
            assert sup.generation == generation + 1
            assert "still running on the GPU" in (sup.status().restart_reason or "")
            # The busy process is gone; the relaunch becoming ready is not waited for (a vLLM import
            # of its own): test_supervisor_faults.py's hard-cancel restart proves that path ready.
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and sup.status().pid in (None, busy_pid):
                time.sleep(0.2)
            assert sup.status().pid not in (None, busy_pid) and not alive(busy_pid)
        finally:
            supervisor.stop_all()
    assert not sup.alive()


def test_auto_serving_falls_back_down_the_planner_ladder_on_oom(tmp_path, monkeypatch):
    """Serving 'auto' on an 80 GB card picks no offload for TI2V-5B; the stub (like a real card that
    is fuller than planned) runs out of memory at load unless CPU offload is on. The supervisor
    asks the planner for the next rung, relaunches once with it, and the node says what changed.
    This is also the supervisor's OOM-fallback test (supervision/starting.py, Starter.start: the leaner
    spec is tried once, noted, and the server stays findable under the requested fingerprint)."""
    _fresh_launcher(tmp_path, monkeypatch, VLLM_OMNI_LAUNCHER_GPU_MEMORY_GB="80",
                    VLLM_OMNI_STUB_OOM_UNLESS="--enable-cpu-offload,--enable-layerwise-offload")
    with ComfyStandIn() as comfy:
        model = run_node("VLLMOmniLoadModel", TI2V)[0]
        serving = _serving(gpus="auto", parallel_mode="auto", auto_fallback=True)
        try:
            handle = run_node("VLLMOmniLocalServer", model, serving, unique_id="srv")[0]
            sup = supervisor.find(handle.server_id)
            assert sup is not None and sup.ready()
            assert sup.spec.memory.offload in ("module", "layerwise")       # what finally fit
            assert sup.requested_spec.memory.offload == "none"             # what the plan chose first
            status = sup.status()
            note = status.fallback_note or ""
            assert "offload" in note
            assert {"--enable-cpu-offload", "--enable-layerwise-offload"} & set(psutil.Process(status.pid).cmdline())
            assert status.requested_fingerprint == sup.requested_spec.fingerprint() != status.fingerprint
            assert supervisor.find(status.requested_fingerprint) is sup and supervisor.find(status.fingerprint) is sup
            pids = stub_pids(tmp_path)
            assert len(pids) == 2 and not alive(pids[0]) and alive(pids[1])   # one failed start, one relaunch
            texts = "\n".join(t for t, _ in comfy.texts)
            assert "Recommended" in texts and "offload" in texts            # plan and change shown on the node
            again = run_node("VLLMOmniLocalServer", model, serving, unique_id="srv")[0]
            assert supervisor.find(again.server_id) is sup and stub_pids(tmp_path) == pids   # the same request reuses it
            image, _, _ = _generate(handle, frames=5)
            assert tuple(image.shape) == (5, 64, 64, 3)
        finally:
            supervisor.stop_all()


def test_auto_fallback_off_stops_with_the_plan_and_the_fix(tmp_path, monkeypatch):
    """Out of memory while loading with auto_fallback off: one start (a configuration error is never
    retried), the error explains it and names offload, and nothing is left. This is also the
    supervisor's OOM-at-load test (registry.get_or_start without a fallback)."""
    _fresh_launcher(tmp_path, monkeypatch, VLLM_OMNI_LAUNCHER_GPU_MEMORY_GB="80",
                    VLLM_OMNI_STUB_OOM_AT_LOAD="1")
    with ComfyStandIn() as comfy:
        model = run_node("VLLMOmniLoadModel", TI2V)[0]
        serving = _serving(gpus="auto", parallel_mode="auto", auto_fallback=False)
        try:
            with pytest.raises(ServerFailure) as caught:
                run_node("VLLMOmniLocalServer", model, serving, unique_id="srv")
            err = caught.value
            assert isinstance(err, LauncherError) and "out of memory" in str(err).lower()
            assert err.kind == failures.OOM_LOAD and err.setting == "offload"
            assert "ran out of memory while loading" in str(err) and "offload" in err.fix
            assert "CUDA out of memory" in err.raw          # upstream's own words kept
            [log] = logs_dir(str(tmp_path)).glob("*.log")   # and where the whole log is
            assert err.fix.endswith(f"; the whole server log is {log}")
            assert len(stub_pids(tmp_path)) == 1, "a configuration error must not be retried"
            assert supervisor.all_servers() == []
            assert comfy.texts[-1][1] == "srv" and err.what in comfy.texts[-1][0]    # the failed status, on the node
        finally:
            supervisor.stop_all()
        assert_no_process_left(tmp_path)
