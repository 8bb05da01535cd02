"""The supervisor against the stub server when things go wrong: slow load, cancel, crash, OOM, hang, port.

Real `vllm serve --omni` code, fake GPU; how the cases check and share servers: supervised_stub.py.
"""
from __future__ import annotations

import os
import socket
import stat
import time
from pathlib import Path

import psutil
import pytest

from processes import alive, assert_no_process_left, stub_pids
from stubserver import wait_for
from supervised_jobs import auth, job_state, session, submit, wait_job
from supervised_stub import START_S, make_config, phases_of, spec_for

from vllm_omni_launcher.client.api import VideoClient
from vllm_omni_launcher.client.http_errors import OOM_FIX
from vllm_omni_launcher.server import registry
from vllm_omni_launcher.server.logs import failures
from vllm_omni_launcher.server.supervision.cancel_policy import RESTART, CancelPolicy
from vllm_omni_launcher.server.logs.failures import ServerFailure
from vllm_omni_launcher.server.registry import Status


# ---- one server's life: slow load, progress, hard cancel, crash after ready (up to its restart) --
def test_slow_load_progress_hard_cancel_and_crash_restart(data_dir: Path) -> None:
    statuses: list[Status] = []
    config = make_config(data_dir, load_delay_s=2, step_s=0.05, crash_after_jobs=2)
    spec = spec_for()
    sup = registry.get_or_start(spec, config, on_status=statuses.append)

    # -- startup phases, in order, as the user sees them
    phases = phases_of(statuses)
    order = ["starting", "downloading", "loading", "warmup", "ready"]
    assert phases[0] == "starting" and phases[-1] == "ready" and {"loading", "warmup"} <= set(phases)
    assert phases == sorted(phases, key=order.index), phases
    assert any("Model loaded" in s.text for s in statuses)
    status = sup.status()
    assert status.ready and status.generation == 1 and status.url == sup.url and status.last_error is None
    assert status.text.startswith("Ready") and sup.url in status.text

    # -- the key lives only in the child's environment
    key = sup.api_key
    assert key and len(key) >= 32
    server = psutil.Process(status.pid)
    assert key not in " ".join(server.cmdline())
    env = server.environ()
    assert env["VLLM_API_KEY"] == key
    assert env["VLLM_OMNI_SERVER_STORAGE__PATH"].startswith(str(data_dir))
    assert key not in repr(sup) and key not in repr(status) and key not in " ".join(s.text for s in statuses)
    assert key not in Path(status.log_path).read_text(errors="replace")
    http = session()
    assert http.get(f"{sup.url}/v1/models", timeout=10).status_code == 401
    models = http.get(f"{sup.url}/v1/models", headers=auth(sup), timeout=10).json()
    assert [m["id"] for m in models["data"]] == [spec.served_name]
    # the server tree is its own process group, not ComfyUI's
    assert os.getpgid(status.pid) == sup.pgid != os.getpgid(0)
    assert stat.S_IMODE(next((data_dir / "state").glob("server-*.json")).stat().st_mode) == 0o600

    # -- a job shows real denoise progress (the warm-up run does not count)
    seen: list[tuple[int, int, int]] = []
    job = submit(sup, steps=8)
    while job_state(sup, job)["status"] not in ("completed", "failed"):
        p = sup.progress()
        if p is not None:
            seen.append((p.run_id, p.step, p.total))
        time.sleep(0.05)
    assert job_state(sup, job)["status"] == "completed"
    final = sup.progress()
    assert final is not None and final.run_id == 1 and final.done and final.total == 8 and final.eta_s == 0
    assert {r for r, _, _ in seen} <= {1} and all(t == 8 for _, _, t in seen)

    # -- cancel that restarts: DELETE cannot stop a running Wan denoise; with a policy that weighs any
    #    denoise left above a restart, the server is restarted once the grace is over
    port, first_pid = status.port, status.pid
    long_job = submit(sup, steps=200)
    wait_for(lambda: (p := sup.progress()) is not None and p.run_id == 2 and p.step >= 2, 120, "the long job to run")
    deleted = http.delete(f"{sup.url}/v1/videos/{long_job}", headers=auth(sup), timeout=30)
    assert deleted.status_code == 200, deleted.text
    sup.cancel_policy = CancelPolicy(grace_s=1.0, ratio=0.0, slack_s=0.0)
    assert sup.cancel_job(long_job, run_floor=1).action == RESTART
    wait_for(lambda: long_job in (sup.status().restart_reason or ""), 60, "the restart for the cancelled job")
    reason = sup.status().restart_reason
    assert "still running on the GPU" in reason and "restarting the server" in reason
    assert sup.wait_ready(START_S)
    status = sup.status()
    assert status.generation == 2 and status.port == port and status.ready
    assert not alive(first_pid)
    assert sup.progress().aborted and sup.progress().run_id == 2
    # the relaunch is ready a moment before the restart is counted (Recovery._relaunch)
    wait_for(lambda: sup.status().restarts == 1, 30, "the hard-cancel restart to be counted")

    # -- crash after ready (the stub's engine dies after its 2nd job): the restart begins.  Its relaunch
    #    is not waited for (a vLLM import): a crash's relaunch is Recovery._restart_after(.., "crash") ->
    #    _relaunch, the path the hang restart below (test_oom_in_job_keeps_the_server_and_a_hang_restarts_it)
    #    proves ready, counted, "Restarted after: ..." and serving jobs.
    for seed in (1, 2):
        assert wait_job(sup, submit(sup, seed=seed))["status"] == "completed"
    crashed_pid = sup.status().pid
    wait_for(lambda: (s := sup.status()).generation == 3 and s.pid != crashed_pid, START_S,
             "the restart after the crash to start a new server")
    status = sup.status()
    assert status.last_error_kind == failures.CRASH and "exited after it was ready" in status.last_error
    assert "exited after it was ready" in status.restart_reason and not alive(crashed_pid)

    pgid = sup.pgid
    registry.stop(spec.fingerprint())
    assert sup.status().phase == "stopped" and registry.find(spec.fingerprint()) is None
    assert_no_process_left(data_dir, (pgid,))
    assert list((data_dir / "state").glob("*.json")) == []


# ---- OOM during a job (server survives), then a hung server (restarted) ----------------------
def test_oom_in_job_keeps_the_server_and_a_hang_restarts_it(data_dir: Path) -> None:
    # 8 s of failed /health before "hung": a healthy stub on a busy 2-core box must not miss that long
    config = make_config(data_dir, hang_timeout_s=8.0, oom_in_job=1, hang_after_jobs=1, step_s=0.02)
    sup = registry.get_or_start(spec_for(), config)
    first = sup.status()

    job_id = submit(sup, steps=6)
    assert wait_job(sup, job_id)["status"] == "failed"
    # what Generate Video shows for it: the job's state read and explained by the launcher's client
    with VideoClient(sup.url, api_key=sup.api_key, supervised=True) as client:
        explained = client.job_failure(job_id, client.status(job_id))
    assert f"ran out of memory while generating job {job_id}" in explained.what and explained.fix == OOM_FIX
    assert "out of memory" in explained.raw.lower() and sup.api_key not in str(explained) + explained.raw
    wait_for(lambda: sup.status().last_error_kind == failures.OOM_JOB, 30, "the OOM to show on the status")
    status = sup.status()
    assert "during a job" in status.last_error and "ran out of GPU memory" in status.text
    assert status.ready and status.generation == 1 and status.pid == first.pid and alive(first.pid)
    assert sup.progress().aborted

    # the next job works on the same server; then the stub's HTTP loop wedges (SIGTERM ignored)
    assert wait_job(sup, submit(sup, steps=4, seed=2))["status"] == "completed"
    wait_for(lambda: sup.status().last_error_kind == failures.HUNG, 60, "the hang to be noticed")
    wait_for(lambda: (s := sup.status()).generation == 2 and s.ready and s.restarts == 1, START_S,
             "the restart after the hang")
    status = sup.status()
    assert "stopped answering /health" in status.last_error and status.restarts == 1
    assert status.text.startswith("Restarted after: stopped answering"), status.text
    assert not alive(first.pid)
    # the knobs apply per server process: its first job runs out of memory again, the next works
    assert wait_job(sup, submit(sup, steps=2, seed=3))["status"] == "failed"
    assert wait_job(sup, submit(sup, steps=2, seed=4))["status"] == "completed"
    pgid = sup.pgid
    registry.stop_all()
    assert_no_process_left(data_dir, (pgid,))


# ---- OOM while loading (explained, never retried) and the OOM fallback (the leaner spec tried once,
#      noted): test_nodes_stub.py::test_auto_fallback_off_stops_with_the_plan_and_the_fix and
#      ::test_auto_serving_falls_back_down_the_planner_ladder_on_oom drive the same
#      registry.get_or_start -> Starter.start (supervision/starting.py) through the Local Server node.


# ---- cancel while the real server loads its weights: LaunchCancelled, nothing left ----------
def test_cancel_while_loading_stops_everything_within_2s(data_dir: Path) -> None:
    statuses: list[Status] = []
    cancel_at: list[float] = []

    def should_cancel() -> bool:
        if not cancel_at and any(s.phase == "loading" and s.progress for s in statuses):
            cancel_at.append(time.monotonic())
        return bool(cancel_at)

    with pytest.raises(registry.LaunchCancelled) as caught:
        registry.get_or_start(spec_for(), make_config(data_dir, load_delay_s=300), on_status=statuses.append,
                              should_cancel=should_cancel)
    took = time.monotonic() - cancel_at[0]
    assert took < 3.0, f"the cancel took {took:.1f} s (the issue allows 2 s)"
    assert caught.value.kind == failures.CANCELLED
    pids = stub_pids(data_dir)
    assert pids and not [p for p in pids if alive(p)], "checked at once: no process outlived the cancel"
    assert registry.all_servers() == [] and list((data_dir / "state").glob("*.json")) == []
    shards = [s.progress for s in statuses if s.phase == "loading" and s.progress]
    assert shards and shards[-1][2] == "shards" and shards[-1][0] == shards[-1][1], shards
    assert statuses[-1].phase == "stopped" and all(a != b for a, b in zip(statuses, statuses[1:]))


# ---- a configured port that is taken: clear error, nothing launched -------------------------
def test_configured_port_in_use(data_dir: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ServerFailure) as caught:
            registry.get_or_start(spec_for(), make_config(data_dir, port=port))
    err = caught.value
    assert err.kind == failures.PORT_IN_USE and err.setting == "port" and str(port) in err.what
    assert "VLLM_OMNI_LAUNCHER_PORT" in err.fix
    assert stub_pids(data_dir) == [] and registry.all_servers() == []


# ---- keep-alive expiry, restart on next use, and spec changes on overlapping GPUs -----------
