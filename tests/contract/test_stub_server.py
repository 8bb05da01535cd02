"""The stub vLLM-Omni server (stub_vllm_serve.py) behaves like ``vllm serve MODEL --omni``.

Runs under the ComfyUI-side python (no vllm); each stub runs under the server python from
``VLLM_OMNI_LAUNCHER_TEST_SERVER_PYTHON`` and the tests fail if it is unset.

A stub start costs as much as importing vllm + vllm-omni, so each scenario below drives one
stub through a short script and records what it saw; the scenarios that the selected tests
need run concurrently (``VLLM_OMNI_STUB_TEST_PARALLEL``, default 3) when the module starts,
and every test asserts on the record of its scenario.  The plain configurations are the
session's shared stubs (``shared_stubs.py``), which other modules' tests may have used
before: those scenarios read the log from where their own requests start.  The others start
their own stub.  Every stub runs in its own process group, killed when its scenario ends
(a shared one at the end of the session, or here when its scenario ends it).
"""
from __future__ import annotations

import concurrent.futures
import io
import os
import re
import json
import signal
import socket
import sys
import tempfile
import time
from pathlib import Path

import av
import pytest
import requests
from PIL import Image

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import frame_code  # noqa: E402
import stubserver  # noqa: E402
from shared_stubs import I2V, I2V_SPLIT, KEY, OFFLOAD_FLAGS, T2V, T2V_KEYED, TI2V, TI2V_OFFLOAD  # noqa: E402

PARALLEL = int(os.environ.get("VLLM_OMNI_STUB_TEST_PARALLEL", "3"))
HEALTH_TIMEOUT = 900.0
JOB_TIMEOUT = 120.0
OOM_TEXT = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
            "capacity of 23.55 GiB of which 1.02 GiB is free.")


# --------------------------------------------------------------------------- helpers
def png(width: int, height: int) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (width, height), (180, 40, 40)).save(buf, "PNG")
    return buf.getvalue()


def submit(stub, key: str | None = None, image: bytes | None = None, sync: bool = False, **fields):
    data = {"prompt": "a cat boxing on a stage", **{k: str(v) for k, v in fields.items()}}
    files = {"input_reference": ("frame.png", image, "image/png")} if image is not None else None
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    path = "/v1/videos/sync" if sync else "/v1/videos"
    return requests.post(stub.url + path, data=data, files=files, headers=headers, timeout=JOB_TIMEOUT)


def wait_job(stub, video_id: str, key: str | None = None) -> requests.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    deadline = time.monotonic() + JOB_TIMEOUT
    while time.monotonic() < deadline:
        r = requests.get(f"{stub.url}/v1/videos/{video_id}", headers=headers, timeout=30)
        if r.json().get("status") in ("completed", "failed"):
            return r
        time.sleep(0.1)
    raise TimeoutError(f"job {video_id} did not finish; log tail:\n{stub.stderr_text()[-4000:]}")


def run_job(stub, key: str | None = None, image: bytes | None = None, **fields) -> tuple[requests.Response, bytes]:
    created = submit(stub, key=key, image=image, **fields)
    assert created.status_code == 200, created.text
    final = wait_job(stub, created.json()["id"], key)
    content = b""
    if final.json()["status"] == "completed":
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        got = requests.get(f"{stub.url}/v1/videos/{created.json()['id']}/content", headers=headers, timeout=60)
        assert got.status_code == 200, got.text
        content = got.content
    return final, content


def decode_mp4(data: bytes) -> dict:
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.video[0]
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(stream)]
        return {"codec": stream.codec_context.name, "pix_fmt": stream.codec_context.pix_fmt,
                "fps": float(stream.average_rate), "shapes": {f.shape for f in frames},
                "codes": [frame_code.decode(f) for f in frames]}


def group_members(pgid: int) -> list[int]:
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(entry.name))
    return members


def health_hangs(stub, timeout: float = 3.0) -> bool:
    try:
        requests.get(stub.url + "/health", timeout=timeout)
        return False
    except requests.exceptions.Timeout:
        return True


# --------------------------------------------------------------------------- scenarios
SCENARIOS = {}


def scenario(fn):
    """A scenario that starts its own stub."""
    SCENARIOS[fn.__name__] = lambda pool: fn()
    return fn


def pooled_scenario(fn):
    """A scenario on one of the session's shared stubs: ``fn(pool)``."""
    SCENARIOS[fn.__name__] = fn
    return fn


def uses(name: str):
    def mark(test):
        test._stub_scenario = name
        return test
    return mark


def _ready(stub) -> dict:
    stub.wait_healthy(HEALTH_TIMEOUT)
    return {"health": stub.health(), "pid": stub.proc.pid, "stub_pid": stub.stub_pid()}


@pooled_scenario
def t2v(pool):
    # Ends the process (SIGTERM), so it takes the shared stub out of the pool.
    with pool.retire(T2V_KEYED) as stub:
        obs = _ready(stub)
        obs["health_no_key"] = requests.get(stub.url + "/health", timeout=10).status_code
        no_key = requests.get(stub.url + "/v1/models", timeout=10)
        obs["models_no_key"] = (no_key.status_code, no_key.json())
        obs["videos_no_key"] = requests.get(stub.url + "/v1/videos", timeout=10).status_code
        obs["models"] = requests.get(stub.url + "/v1/models", headers={"Authorization": f"Bearer {KEY}"},
                                     timeout=10).json()
        job, mp4 = run_job(stub, key=KEY, size="64x64", num_frames=5, fps=8, seed=1234, num_inference_steps=2)
        obs["roundtrip"] = (job.status_code, job.json(), decode_mp4(mp4))
        job, mp4 = run_job(stub, key=KEY, size="70x40", num_frames=6, fps=16, seed=77, num_inference_steps=2)
        obs["floored"] = (job.json(), decode_mp4(mp4))
        sync = submit(stub, key=KEY, sync=True, size="64x64", num_frames=9, fps=8, seed=9, num_inference_steps=2)
        obs["sync"] = (sync.status_code, sync.headers.get("content-type"), decode_mp4(sync.content))
        # DELETE while the denoise runs: the record goes, the "GPU" keeps stepping.
        submitted = len(stub.stderr_text())
        created = submit(stub, key=KEY, size="64x64", num_frames=5, seed=3, num_inference_steps=60)
        vid = created.json()["id"]
        headers = {"Authorization": f"Bearer {KEY}"}
        deadline = time.monotonic() + JOB_TIMEOUT
        while not re.search(r"\| [1-9]\d?/60 \[", stub.stderr_text()[submitted:]) and time.monotonic() < deadline:
            time.sleep(0.02)
        offset = len(stub.stderr_text())
        deleted = requests.delete(f"{stub.url}/v1/videos/{vid}", headers=headers, timeout=30)
        obs["delete"] = (deleted.status_code, deleted.json(),
                         requests.get(f"{stub.url}/v1/videos/{vid}", headers=headers, timeout=10).status_code,
                         "60/60" in stub.stderr_text()[submitted:offset])
        stub.wait_for_text("aborted: Request", timeout=JOB_TIMEOUT, since=offset)
        obs["after_delete_log"] = stub.stderr_text()[offset:]
        # A job that stalls (extra_params stub_hang: the GPU never finishes it) is the last one this
        # process runs: the engine stays busy with it until SIGTERM.
        obs["hang_in_job"] = _stalled_job(stub, headers, json.dumps({"stub_hang": True}))
        # SIGTERM ends the process (and its group) cleanly, the stalled job notwithstanding.
        os.kill(stub.proc.pid, signal.SIGTERM)
        obs["sigterm_rc"] = stub.wait_exit(120)
        obs["group_left"] = group_members(stub.proc.pid)
        obs["log"] = stub.stderr_text()
    return obs


@pooled_scenario
def i2v(pool):
    with pool.lease(I2V_SPLIT) as (stub,):
        obs = _ready(stub)
        err_from = len(stub.stderr_text())
        obs["models"] = requests.get(stub.url + "/v1/models", timeout=10).json()
        obs["no_image"], _ = run_job(stub, size="64x64", num_frames=5, num_inference_steps=2)
        obs["bad_size"], _ = run_job(stub, image=png(80, 48), width=72, height=64, num_frames=5,
                                     num_inference_steps=2)
        job, mp4 = run_job(stub, image=png(80, 48), size="64x48", num_frames=9, fps=16, seed=5,
                           num_inference_steps=2)
        obs["good"] = (job.json(), decode_mp4(mp4))
        obs["stderr"], obs["stdout"] = stub.stderr_text(), stub.stdout_text()
        obs["own_stderr"] = obs["stderr"][err_from:]   # this scenario's jobs (the shared stub ran others)
        obs["log"] = stub.output_text()
    return obs


@pooled_scenario
def ti2v_with_offload(pool):
    with pool.lease(TI2V_OFFLOAD) as (stub,):
        obs = _ready(stub)
        obs["startup_log"] = stub.wait_for_text("Application startup complete.", timeout=10).split(
            "Application startup complete.", 1)[0]
        obs["models"] = requests.get(stub.url + "/v1/models", timeout=10).json()
        job, mp4 = run_job(stub, size="70x70", num_frames=9, fps=24, seed=300, num_inference_steps=2)
        obs["floored"] = (job.json(), decode_mp4(mp4))
        obs["oom_knob"], _ = run_job(stub, size="64x64", num_frames=5, seed=1, num_inference_steps=4,
                                     extra_params=json.dumps({"stub_oom": True}))
        job, mp4 = run_job(stub, size="64x64", num_frames=5, num_inference_steps=2)
        obs["no_seed"] = (job.json(), decode_mp4(mp4))
        obs["log"] = stub.stderr_text()
    return obs


def _exits(model: str, flags=(), env=None) -> dict:
    with stubserver.run_stub(model, flags=flags, env=env) as stub:
        rc = stub.wait_exit(HEALTH_TIMEOUT)
        return {"rc": rc, "log": stub.stderr_text()}


@scenario
def fake_flag():
    return _exits(T2V, flags=["--model-type", "wan2_2"])


@scenario
def too_few_devices():
    return _exits(T2V, flags=["--usp", "2", "--cfg-parallel-size", "2"], env={"CUDA_VISIBLE_DEVICES": "0,1"})


@scenario
def oom_unless_flag_missing():
    # The OOM at load of both knobs (VLLM_OMNI_STUB_OOM_AT_LOAD=1, and OOM_UNLESS without its flag)
    # is one line of the fake GPU (Knobs.oom_at_load_now): this one process shows upstream's reaction
    # to it.  OOM_AT_LOAD itself is driven end to end (kind, fix, raw text, no retry) by
    # test_nodes_stub.py::test_auto_fallback_off_stops_with_the_plan_and_the_fix.
    return _exits(TI2V, env={"VLLM_OMNI_STUB_OOM_UNLESS": OFFLOAD_FLAGS})


@scenario
def oom_in_job_then_crash():
    with tempfile.TemporaryDirectory() as tmp:
        jobs_file = Path(tmp) / "jobs.txt"
        env = {"VLLM_OMNI_STUB_OOM_IN_JOB": "1", "VLLM_OMNI_STUB_CRASH_AFTER_JOBS": "1",
               "VLLM_OMNI_STUB_STEP_S": "0.01", "VLLM_OMNI_STUB_JOBS_FILE": str(jobs_file)}
        with stubserver.run_stub(TI2V, env=env) as stub:
            obs = _ready(stub)
            obs["refused"] = submit(stub, size="64x64", num_frames=5, num_inference_steps=500).status_code
            obs["job1"], _ = run_job(stub, size="64x64", num_frames=5, seed=1, num_inference_steps=4)
            obs["health_after_oom"] = stub.health()
            obs["job2"], _ = run_job(stub, size="64x64", num_frames=5, seed=2, num_inference_steps=4)
            obs["rc"] = stub.wait_exit(120)
            obs["group_left"] = group_members(stub.proc.pid)
            obs["log"] = stub.stderr_text()
            obs["jobs_file"] = jobs_file.read_text().splitlines() if jobs_file.exists() else None
    return obs


@scenario
def load_delay_then_hang():
    env = {"VLLM_OMNI_STUB_LOAD_DELAY_S": "6", "VLLM_OMNI_STUB_HANG_AFTER_JOBS": "1",
           "VLLM_OMNI_STUB_STEP_S": "0.3"}
    with stubserver.run_stub(T2V, env=env) as stub:
        obs = {}
        stub.wait_for_text("Worker 0: Initialized device and distributed environment.", timeout=HEALTH_TIMEOUT)
        try:
            socket.create_connection((stub.host, stub.port), timeout=5).close()
            obs["during_load"] = "connected"
        except ConnectionRefusedError:
            obs["during_load"] = "refused"
        obs["loaded_when_probed"] = "Loading weights took" in stub.stderr_text()
        obs.update(_ready(stub))
        obs["job"], _ = run_job(stub, size="64x64", num_frames=5, seed=8, num_inference_steps=4)
        deadline = time.monotonic() + 60
        obs["hung"] = False
        while time.monotonic() < deadline and not obs["hung"]:
            obs["hung"] = health_hangs(stub)
        obs["alive_while_hung"] = stub.alive()
        obs["log"] = stub.stderr_text()
    return obs


def _stalled_job(stub, headers: dict, extra_params: str) -> dict:
    """A job that stalls after its first step, DELETE'd, then a second one that must queue behind
    it (the t2v scenario's last jobs: the engine never gets free again)."""
    obs: dict = {}
    since = len(stub.stderr_text())
    created = submit(stub, key=KEY, size="64x64", num_frames=5, seed=4, num_inference_steps=5,
                     extra_params=extra_params)
    vid = created.json()["id"]
    stub.wait_for_text("1/5 [", timeout=JOB_TIMEOUT, since=since)
    time.sleep(2.0)
    obs["stalled_status"] = requests.get(f"{stub.url}/v1/videos/{vid}", headers=headers, timeout=10).json()["status"]
    obs["stalled_log"] = stub.stderr_text()[since:]
    deleted = requests.delete(f"{stub.url}/v1/videos/{vid}", headers=headers, timeout=30)
    obs["delete"] = (deleted.status_code,
                     requests.get(f"{stub.url}/v1/videos/{vid}", headers=headers, timeout=10).status_code)
    second = submit(stub, key=KEY, size="64x64", num_frames=5, seed=5, num_inference_steps=5).json()["id"]
    time.sleep(2.0)
    obs["second_status"] = requests.get(f"{stub.url}/v1/videos/{second}", headers=headers, timeout=10).json()["status"]
    obs["health_during_hang"] = stub.health()
    obs["alive"] = stub.alive()
    obs["log"] = stub.stderr_text()[since:]
    return obs


# --------------------------------------------------------------------------- module fixture
@pytest.fixture(scope="module")
def runs(request, stub_pool) -> dict:
    here = os.path.abspath(__file__)
    needed = sorted({_scenario_of(item) for item in request.session.items
                     if os.path.abspath(str(getattr(item, "path", "") or item.fspath)) == here} - {None})
    results: dict = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, PARALLEL)) as pool:
        futures = {name: pool.submit(SCENARIOS[name], stub_pool) for name in needed}
        for name, future in futures.items():
            try:
                results[name] = future.result()
            except Exception as exc:  # re-raised by the tests of that scenario (Ctrl-C is not caught)
                results[name] = exc
    return results


def _scenario_of(item) -> str | None:
    callspec = getattr(item, "callspec", None)
    if callspec is not None and "scenario_name" in callspec.params:
        return callspec.params["scenario_name"]
    return getattr(getattr(item, "function", None), "_stub_scenario", None)


def outcome(runs: dict, name: str) -> dict:
    result = runs[name]
    if isinstance(result, BaseException):
        raise result
    return result


# --------------------------------------------------------------------------- tests: models
@pytest.mark.parametrize("scenario_name,model", [("t2v", T2V), ("i2v", I2V), ("ti2v_with_offload", TI2V)])
def test_starts_healthy_and_lists_the_hf_id(runs, scenario_name, model):
    obs = outcome(runs, scenario_name)
    assert obs["health"] == 200
    assert [m["id"] for m in obs["models"]["data"]] == [model]
    assert f"Detected diffusion model: {model}" in obs["log"]


@uses("t2v")
def test_startup_prints_the_real_phase_lines_in_order(runs):
    log = outcome(runs, "t2v")["log"]
    phases = ["Delegating entrypoint handling to vllm-omni", f"Detected diffusion model: {T2V}",
              "Detected pipeline 'wan2_2_ti2v' from model_index.json (_class_name='WanPipeline')",
              "Prefetching", "Multi-thread loading shards", "Loading weights took", "Model loading took",
              "Model runner: Model loaded successfully.", "dummy run to warm up the model",
              "Detected pure diffusion mode (single diffusion stage)",
              "Starting vLLM API server (pure diffusion mode) on http://127.0.0.1:",
              "Available routes are:", "Application startup complete."]
    positions = [log.find(p) for p in phases]
    assert -1 not in positions, dict(zip(phases, positions))
    assert positions == sorted(positions)
    assert re.search(r"Model loading took \d+\.\d{4} GiB and \d+\.\d{6} seconds", log)


@uses("t2v")
def test_writes_stub_pid_first(runs):
    obs = outcome(runs, "t2v")
    assert obs["stub_pid"] == obs["pid"]
    assert obs["log"].startswith(f"STUB_PID={obs['pid']}\n")


@uses("t2v")
def test_v1_routes_need_the_api_key_but_health_does_not(runs):
    obs = outcome(runs, "t2v")
    assert obs["health_no_key"] == 200
    assert obs["models_no_key"] == (401, {"error": "Unauthorized"})
    assert obs["videos_no_key"] == 401


@uses("t2v")
def test_job_round_trip_frames_carry_index_and_seed(runs):
    status, job, video = outcome(runs, "t2v")["roundtrip"]
    assert status == 200 and job["status"] == "completed" and job["progress"] == 100
    assert (job["num_frames"], job["fps"], job["model"]) == (5, 8.0, T2V)
    assert (video["codec"], video["pix_fmt"], video["fps"]) == ("h264", "yuv420p", 8.0)
    assert video["shapes"] == {(64, 64, 3)}
    assert video["codes"] == [(i, 1234 % 256) for i in range(5)]


@uses("t2v")
def test_a14b_floors_size_to_16_and_frames_to_4k_plus_1(runs):
    job, video = outcome(runs, "t2v")["floored"]
    assert job["num_frames"] == 5
    assert video["shapes"] == {(32, 64, 3)}
    assert video["codes"] == [(i, 77) for i in range(5)]


@uses("t2v")
def test_sync_endpoint_returns_the_mp4(runs):
    status, content_type, video = outcome(runs, "t2v")["sync"]
    assert (status, content_type) == (200, "video/mp4")
    assert video["codes"] == [(i, 9) for i in range(9)]


@uses("t2v")
def test_delete_drops_the_job_but_the_denoise_runs_to_its_end(runs):
    obs = outcome(runs, "t2v")
    status, body, get_after, finished_before = obs["delete"]
    assert status == 200 and body["deleted"] is True and get_after == 404
    assert not finished_before
    assert "60/60" in obs["after_delete_log"]  # progress kept coming after the DELETE


@uses("t2v")
def test_sigterm_exits_cleanly_with_its_process_group(runs):
    obs = outcome(runs, "t2v")
    assert obs["sigterm_rc"] == 0
    assert obs["group_left"] == []
    assert "Application shutdown complete." in obs["log"]


@uses("t2v")
def test_denoise_progress_is_real_tqdm(runs):
    log = outcome(runs, "t2v")["log"]
    assert re.search(r"\r  0%\|          \| 0/2 \[00:00<\?, \?it/s\]", log)
    assert re.search(r"\r100%\|██████████\| 2/2 \[\d\d:\d\d<\d\d:\d\d, +\d+\.\d+it/s\]", log)


@uses("i2v")
def test_progress_goes_to_stderr_and_log_lines_to_stdout(runs):
    obs = outcome(runs, "i2v")
    assert "| 2/2 [" in obs["own_stderr"] and "| 2/2 [" not in obs["stdout"]
    assert obs["stderr"].startswith("STUB_PID=")
    assert "Model loading took" in obs["stdout"] and "Starting vLLM API server" in obs["stdout"]


# --------------------------------------------------------------------------- tests: I2V / TI2V
@uses("i2v")
def test_i2v_without_image_fails_with_the_real_message(runs):
    job = outcome(runs, "i2v")["no_image"]
    body = job.json()
    assert job.status_code == 500 and body["status"] == "failed" and body["error"]["code"] == 500
    assert "No image is provided. This model requires an image to run." in body["error"]["message"]


@uses("i2v")
def test_i2v_size_not_multiple_of_16_fails_the_job(runs):
    job = outcome(runs, "i2v")["bad_size"]
    assert job.status_code == 500 and job.json()["status"] == "failed"
    assert job.json()["error"]["message"] == "`height` and `width` have to be divisible by 16 but are 64 and 72."


@uses("i2v")
def test_i2v_with_image_renders(runs):
    job, video = outcome(runs, "i2v")["good"]
    assert job["status"] == "completed" and job["num_frames"] == 9
    assert video["shapes"] == {(48, 64, 3)}
    assert video["codes"] == [(i, 5) for i in range(9)]


@uses("ti2v_with_offload")
def test_ti2v_floors_size_to_32(runs):
    job, video = outcome(runs, "ti2v_with_offload")["floored"]
    assert job["num_frames"] == 9
    assert video["shapes"] == {(64, 64, 3)}
    assert video["codes"] == [(i, 300 % 256) for i in range(9)]


@uses("ti2v_with_offload")
def test_omitted_seed_gives_one_random_seed_per_job(runs):
    job, video = outcome(runs, "ti2v_with_offload")["no_seed"]
    assert job["status"] == "completed"
    assert [c[0] for c in video["codes"]] == list(range(5))
    assert len({c[1] for c in video["codes"]}) == 1


# --------------------------------------------------------------------------- tests: refusals
@uses("fake_flag")
def test_blog_flag_is_an_argparse_error(runs):
    obs = outcome(runs, "fake_flag")
    assert obs["rc"] == 2
    assert "vllm: error: unrecognized arguments: --model-type wan2_2" in obs["log"]


@uses("too_few_devices")
def test_world_size_above_visible_devices_is_refused(runs):
    obs = outcome(runs, "too_few_devices")
    assert obs["rc"] != 0
    assert "Stage 0 requires 4 device(s) based on parallel_config, but 2 device(s) are available" in obs["log"]
    assert "Traceback (most recent call last):" in obs["log"]
    assert "Application startup complete." not in obs["log"]


# --------------------------------------------------------------------------- tests: knobs
@uses("oom_unless_flag_missing")
def test_oom_at_load_fails_stage_init(runs):
    obs = outcome(runs, "oom_unless_flag_missing")
    assert obs["rc"] != 0
    assert OOM_TEXT in obs["log"]
    assert "RuntimeError: Orchestrator initialization failed: CUDA out of memory." in obs["log"]
    assert "Application startup complete." not in obs["log"]


@uses("oom_unless_flag_missing")
def test_oom_unless_ooms_without_the_flag(runs):
    obs = outcome(runs, "oom_unless_flag_missing")
    assert obs["rc"] != 0 and OOM_TEXT in obs["log"]


@uses("ti2v_with_offload")
def test_oom_unless_starts_with_the_flag(runs):
    obs = outcome(runs, "ti2v_with_offload")
    assert obs["health"] == 200 and "OutOfMemoryError" not in obs["startup_log"]


@uses("ti2v_with_offload")
def test_stub_oom_extra_param_fails_that_job_and_the_next_one_renders(runs):
    obs = outcome(runs, "ti2v_with_offload")
    job = obs["oom_knob"]
    assert job.status_code == 500 and job.json()["status"] == "failed"
    assert job.json()["error"]["message"].startswith("CUDA out of memory. Tried to allocate 2.00 GiB.")
    assert obs["no_seed"][0]["status"] == "completed"


@uses("oom_in_job_then_crash")
def test_oom_in_job_fails_that_job_and_the_server_stays_up(runs):
    obs = outcome(runs, "oom_in_job_then_crash")
    job1 = obs["job1"]
    assert job1.status_code == 500 and job1.json()["status"] == "failed"
    assert job1.json()["error"]["code"] == 500
    assert job1.json()["error"]["message"].startswith("CUDA out of memory. Tried to allocate 2.00 GiB.")
    assert obs["health_after_oom"] == 200
    assert obs["job2"].json()["status"] == "completed"


@uses("oom_in_job_then_crash")
def test_jobs_file_gets_one_line_per_job_request_with_its_status(runs):
    obs = outcome(runs, "oom_in_job_then_crash")
    assert obs["refused"] == 400
    assert obs["jobs_file"] == ["POST /v1/videos 400", "POST /v1/videos 200", "POST /v1/videos 200"]


@uses("oom_in_job_then_crash")
def test_crash_after_jobs_kills_the_process(runs):
    obs = outcome(runs, "oom_in_job_then_crash")
    assert obs["rc"] != 0
    assert "EngineDeadError" in obs["log"]
    assert "died unexpectedly" in obs["log"]
    assert obs["group_left"] == []


@uses("load_delay_then_hang")
def test_port_refuses_connections_while_loading(runs):
    obs = outcome(runs, "load_delay_then_hang")
    assert obs["during_load"] == "refused" and obs["loaded_when_probed"] is False
    assert obs["health"] == 200


@uses("load_delay_then_hang")
def test_step_knob_paces_the_progress(runs):
    log = outcome(runs, "load_delay_then_hang")["log"]
    for step in (1, 2, 3, 4):  # each step is printed on its own (steps are longer than tqdm's refresh)
        assert f"| {step}/4 [" in log


@uses("load_delay_then_hang")
def test_hang_after_jobs_stops_answering_but_stays_alive(runs):
    obs = outcome(runs, "load_delay_then_hang")
    assert obs["job"].json()["status"] == "completed"
    assert obs["hung"] is True and obs["alive_while_hung"] is True


@uses("t2v")
def test_hang_in_job_stalls_until_deleted_and_the_gpu_stays_busy(runs):
    obs = outcome(runs, "t2v")["hang_in_job"]
    assert obs["stalled_status"] == "in_progress"
    assert "1/5 [" in obs["stalled_log"] and "5/5 [" not in obs["stalled_log"]
    assert obs["delete"] == (200, 404)
    assert obs["second_status"] == "queued"  # the stalled denoise still holds the engine
    assert obs["health_during_hang"] == 200 and obs["alive"]
    assert "5/5 [" not in obs["log"]
