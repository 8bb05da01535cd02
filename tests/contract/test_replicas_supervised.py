"""Replicas (issue 17) against the real vLLM-Omni 0.30: the flag our spec writes means N replicas on
the GPUs we meant (the real parser and config resolution), and a replicated server is supervised
as one server (the real orchestrator spawning one StageDiffusionProc per replica; fake GPU).

What upstream does on its own when a replica dies (docs/replicas.md, section 3): nothing. The job
on it fails, the survivors serve, /health stays 200. So the supervisor must notice the replica
process itself, say which one died, and restart the whole group.

One stub life (two replicas, then the restart after kill -9 of one, up to the new server process)
carries every assertion of the supervision test: a replicated start spawns and imports vLLM once
per replica, one after the other (3 vLLM imports per generation), which costs minutes on a small
CI box.
"""
from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import stubserver
from stubserver import wait_for
from processes import alive, assert_no_process_left, stub_pids
from supervised_jobs import submit, wait_job

from vllm_omni_launcher.server.config.local_config import LocalConfig
from vllm_omni_launcher.server.registry import Status, Supervisor
from vllm_omni_launcher.server.launch.spec import LaunchSpec, ParallelConfig

TI2V = "Wan-AI/Wan2.2-TI2V-5B-Diffusers"
T2V = "Wan-AI/Wan2.2-T2V-A14B-Diffusers"
I2V = "Wan-AI/Wan2.2-I2V-A14B-Diffusers"
START_S = 900.0          # one replicated stub start: the API process and each replica import vLLM


# ---- the flag, through the real parser and config resolution -------------------------------------
def _probe(resolver: stubserver.Resolver, cases: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """replica_probe.py's probe (upstream's main, resolution and replica layout), on our argv, in the
    session's resolver process (no vLLM import of its own)."""
    [out] = resolver.resolve([{"call": "replica_probe:probe", "input": cases}], timeout=1500)
    assert "call_error" not in out, out["call_error"]
    return out


def _case(spec: LaunchSpec) -> dict[str, Any]:
    argv = spec.build([], 8091, None).argv          # ["serve", MODEL, "--omni", ...]: what `vllm` gets
    return {"argv": argv, "visible_devices": spec.gpu_count}


def test_our_replicas_flag_gives_upstream_n_replicas_on_their_own_gpus(upstream_resolver):
    two = LaunchSpec(TI2V, gpus=(0, 1), replicas=2)
    usp = LaunchSpec(T2V, replicas=2, parallel=ParallelConfig("ulysses", 2))
    i2v = LaunchSpec(I2V, gpus=(0, 1), replicas=2)      # what the spec refuses, built anyway to show why
    out = _probe(upstream_resolver, {"one": _case(LaunchSpec(TI2V, gpus=(0,))), "two": _case(two), "usp": _case(usp),
                  "i2v": _case(i2v)})
    for name in ("one", "two", "usp", "i2v"):
        assert out[name]["ok"], out[name]
    assert (out["one"]["replicas"], out["one"]["runtime"]) == (1, "StageRuntime")
    assert (out["two"]["runtime"], out["two"]["launch_mode"], out["two"]["replicas"],
            out["two"]["replica_devices"]) == ("StageRuntime", "local", 2, ["0", "1"])
    assert (out["usp"]["replicas"], out["usp"]["replica_devices"]) == (2, ["0,1", "2,3"])
    assert out["i2v"]["replicas"] == 1                   # silently one: hence SpecError for I2V replicas


# ---- supervision ----------------------------------------------------------------------------------
def _config(data_dir: Path) -> LocalConfig:
    return LocalConfig(server_command=(stubserver.server_python(), str(stubserver.STUB_SCRIPT)),
                       data_dir=str(data_dir), startup_timeout_s=START_S,
                       extra_env={"VLLM_OMNI_STUB_STEP_S": "0.1"})


def test_a_dead_replica_restarts_the_server_and_stop_leaves_nothing(data_dir: Path) -> None:  # noqa: F811
    seen: list[Status] = []
    sup = Supervisor(LaunchSpec(TI2V, gpus=(0, 1), replicas=2), _config(data_dir))
    sup.start(on_status=seen.append, timeout=START_S)
    try:
        first = sup.status()
        assert first.ready and "2 replicas" in first.text, first.text
        api, *replica_pids = stub_pids(data_dir)          # each process prints STUB_PID first
        assert first.pid == api and len(replica_pids) == 2
        assert sup.replica_pids == replica_pids           # found from the process tree, in start order
        for job in [submit(sup, steps=3, seed=s) for s in (1, 2)]:       # two at once, one per replica
            assert wait_job(sup, job)["status"] == "completed"
        first_pgid = sup.pgid

        victim = replica_pids[1]
        os.kill(victim, signal.SIGKILL)
        wanted = f"Replica 1 of 2 (pid {victim}) died"
        wait_for(lambda: any(wanted in s.text for s in seen), 60, "the status to say which replica died")
        assert any(wanted in s.text and "; restarting in" in s.text for s in seen), [s.text for s in seen]
        # The restart: the whole old group goes and a new server process starts.  Generation 2 is not
        # waited for to be ready (three more vLLM imports, one after the other): the relaunch after a
        # dead replica is Recovery._restart_after(failure, "crash") -> _relaunch -> Starter._once, the
        # same path that test_supervisor_faults.py::test_oom_in_job_keeps_the_server_and_a_hang_restarts_it
        # proves ready, counted, "Restarted after: ..." and serving jobs; and each ready generation has its
        # replica processes recorded (Recovery.watch_ready), which generation 1
        # above proves.
        wait_for(lambda: sup.generation == 2 and (p := sup.status().pid) is not None and p != api, 120,
                 "the restart to spawn generation 2's server process")
        after = sup.status()
        assert wanted in (after.restart_reason or "") and wanted in (after.last_error or "")
        assert "does not restart a dead replica" in after.last_error
        assert not set(sup.replica_pids) & set(replica_pids)        # the dead generation's watch is dropped
        wait_for(lambda: not any(alive(p) for p in [api, *replica_pids]), 30,
                 "the old group to go as a whole")
        assert alive(after.pid)
        pgids = (first_pgid, sup.pgid)
    finally:
        sup.stop()
    assert_no_process_left(data_dir, pgids)             # every STUB_PID gone, both groups empty
