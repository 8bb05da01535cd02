"""The scenarios the stub server's contract tests assert on, and the runner that starts them.

The tests (test_stub_server_serves_like_upstream.py on the shared stubs,
test_stub_server_refuses_and_fails_like_upstream.py on stubs of their own) check that the stub
vLLM-Omni server (stub_vllm_serve.py) behaves like ``vllm serve MODEL --omni``.  They run under
the ComfyUI-side python (no vllm); each stub runs under the server python from
``VLLM_OMNI_LAUNCHER_TEST_SERVER_PYTHON`` and the tests fail if it is unset.

A stub start costs as much as importing vllm + vllm-omni, so each scenario below drives one
stub through a short script and records what it saw; the scenarios that a test module's
selected tests need run concurrently (``VLLM_OMNI_STUB_TEST_PARALLEL``, default 3) when the
module starts (:func:`run_needed_scenarios`), and every test asserts on the record of its
scenario.  The plain configurations are the session's shared stubs (``shared_stubs.py``),
which other modules' tests may have used before: those scenarios read the log from where their
own requests start; a pooled scenario runs once a session (its last jobs leave the engine busy
for good), so all its tests live in one module.  The others start their own stub.  Every stub
runs in its own process group, killed when its scenario ends (a shared one at the end of the
session, or here when its scenario ends it).
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
import requests
from PIL import Image

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import frame_code  # noqa: E402
import stubserver  # noqa: E402
from shared_stubs import I2V_SPLIT, KEY, OFFLOAD_FLAGS, T2V, T2V_KEYED, TI2V, TI2V_OFFLOAD  # noqa: E402

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


# --------------------------------------------------------------------------- runner
def run_needed_scenarios(request, stub_pool) -> dict:
    """Run, concurrently, the scenarios that the selected tests of ``request``'s module use;
    body of each test module's module-scoped ``runs`` fixture."""
    here = os.path.abspath(str(request.module.__file__))
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

