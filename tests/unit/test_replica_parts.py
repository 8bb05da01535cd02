"""Replicas (issue 17): the spec's `replicas` setting, its flag, its checks, its CLI option and widget,
the per-replica planner, and the watch over a real process tree that tells a dead replica apart.

The flag's meaning for the real upstream (parser, config resolution, replica layout) is checked in
tests/contract/test_replicas_supervised.py; here: what the launcher builds and refuses."""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from comfy_standin import run_node
from vllm_omni_launcher.nodes import NODES
from vllm_omni_launcher.cli.launch_options import add_launch_options, spec_from_args
from vllm_omni_launcher.errors import LauncherError, SpecError
from vllm_omni_launcher.planner.launch_plan import GPU_MEMORY_ENV, ServingChoice, resolve_launch
from vllm_omni_launcher.server.launch import replicas
from vllm_omni_launcher.server.supervision import replica_watch
from vllm_omni_launcher.server.logs import failures
from vllm_omni_launcher.server.config.local_config import LocalConfig
from vllm_omni_launcher.server.launch.spec import LaunchSpec, ParallelConfig

T2V = "Wan-AI/Wan2.2-T2V-A14B-Diffusers"
I2V = "Wan-AI/Wan2.2-I2V-A14B-Diffusers"
TI2V = "Wan-AI/Wan2.2-TI2V-5B-Diffusers"
CONFIG = LocalConfig()


def _overrides(spec: LaunchSpec) -> dict:
    flags = spec.flags()
    return json.loads(flags[flags.index("--stage-overrides") + 1])


def _resolve(choice: ServingChoice, model: str, **kw):
    return resolve_launch(choice.base_spec(model, CONFIG), CONFIG, gpus=choice.gpus,
                          auto=choice.parallel_mode == "auto", server_version=(0, 30), **kw)


# --------------------------------------------------------------------------- spec and flag
def test_replicas_are_one_stage_override_naming_every_replicas_gpus():
    two = LaunchSpec(TI2V, gpus=(2, 3), replicas=2)
    assert two.validate(visible_gpus=4) == [] and two.gpu_count == 2
    assert _overrides(two) == {"0": {"num_replicas": 2, "devices": "0,1"}}
    assert two.build(["vllm"], 8000, None).env["CUDA_VISIBLE_DEVICES"] == "2,3"   # devices are logical
    usp = LaunchSpec(T2V, replicas=2, parallel=ParallelConfig("ulysses", 2))
    assert usp.validate(visible_gpus=4) == [] and usp.gpu_count == 4
    assert _overrides(usp) == {"0": {"num_replicas": 2, "devices": "0,1,2,3"}}
    assert usp.flags()[:3] == ["--omni", "--usp", "2"]


def test_one_replica_adds_no_flag_and_leaves_the_fingerprint_as_it_was():
    one = LaunchSpec(TI2V, gpus=(0,))
    assert "--stage-overrides" not in one.flags() and "replicas" not in one.to_dict()
    two = LaunchSpec(TI2V, gpus=(0, 1), replicas=2)
    assert two.to_dict()["replicas"] == 2 and LaunchSpec.from_dict(two.to_dict()) == two
    assert two.fingerprint() != LaunchSpec(TI2V, gpus=(0, 1)).fingerprint()


def test_the_gpus_must_be_replicas_times_the_layout():
    with pytest.raises(SpecError) as few:
        LaunchSpec(TI2V, gpus=(0,), replicas=2).validate()
    assert few.value.setting == "gpus" and "needs 2 GPUs but 1 are selected" in str(few.value)
    assert "2 replicas x 1 GPU(s) each" in few.value.why
    with pytest.raises(SpecError) as idle:
        LaunchSpec(TI2V, gpus=(0, 1, 2, 3), replicas=2).validate()
    assert idle.value.setting == "parallel_mode" and "raise replicas to 4" in idle.value.fix
    with pytest.raises(SpecError) as machine:
        LaunchSpec(TI2V, replicas=3).validate(visible_gpus=2)
    assert machine.value.setting == "replicas" and "this machine shows 2" in machine.value.what


def test_i2v_a14b_replicas_are_refused_because_upstream_ignores_them():
    with pytest.raises(SpecError) as err:
        LaunchSpec(I2V, gpus=(0, 1), replicas=2).validate()
    assert err.value.setting == "replicas" and "ignores num_replicas" in err.value.why
    assert "cfg 2" in err.value.fix
    LaunchSpec(I2V, gpus=(0, 1), parallel=ParallelConfig("cfg", 2)).validate()


def test_replicas_out_of_range_are_refused():
    for bad in (0, replicas.MAX_REPLICAS + 1):
        with pytest.raises(SpecError) as err:
            LaunchSpec(TI2V, replicas=bad).validate()
        assert err.value.setting == "replicas"


def test_the_stage_override_flag_is_the_replicas_setting():
    with pytest.raises(SpecError) as err:
        LaunchSpec(TI2V, extra_flags=("--stage-overrides={}",)).validate()
    assert "is a launcher setting" in err.value.what and "replicas" in err.value.fix


def test_batch_width_above_one_needs_0_30_for_wan():
    with pytest.raises(SpecError) as err:
        LaunchSpec(TI2V, extra_flags=("--max-num-seqs=2",)).validate(version=(0, 26))
    assert "needs vLLM-Omni 0.30" in err.value.what and "do not support request batching" in err.value.why
    LaunchSpec(TI2V, extra_flags=("--max-num-seqs=1",)).validate(version=(0, 26))
    LaunchSpec(TI2V, replicas=2, gpus=(0, 1), extra_flags=("--max-num-seqs", "4")).validate(version=(0, 30))
    with pytest.raises(SpecError, match="whole number"):
        LaunchSpec(TI2V, extra_flags=("--max-num-seqs=0",)).validate()


# --------------------------------------------------------------------------- CLI and node
def test_cli_replicas_option_comes_from_the_declaration():
    parser = argparse.ArgumentParser()
    add_launch_options(parser)
    spec = spec_from_args(parser.parse_args(["--model", TI2V, "--gpus", "0,1", "--replicas", "2"]))
    assert (spec.replicas, spec.gpus) == (2, (0, 1))
    assert spec_from_args(parser.parse_args(["--model", TI2V])).replicas == 1


def test_serving_config_replicas_is_an_optional_appended_widget():
    inputs = NODES["VLLMOmniServingConfig"].inputs()
    added = next(i for i in inputs if i.name == "replicas")
    assert (added.kind, added.optional) == ("INT", True) and inputs.index(added) > max(
        inputs.index(i) for i in inputs if not i.optional)                # after every released widget
    assert (added.default, added.opts["min"], added.opts["max"]) == (1, 1, replicas.MAX_REPLICAS)
    widgets = {i.name: i.default for i in inputs if not i.optional}
    (released,) = run_node("VLLMOmniServingConfig", **widgets)          # a workflow saved before the widget existed
    assert released.replicas == 1
    (choice,) = run_node("VLLMOmniServingConfig", **{**widgets, "parallel_mode": "none", "replicas": 2})
    assert choice.base_spec(TI2V, CONFIG).replicas == 2


# --------------------------------------------------------------------------- planner
def test_auto_plans_one_replica_per_share_and_keeps_the_users_count(monkeypatch):
    monkeypatch.setenv(GPU_MEMORY_ENV, "80,80")
    plan = _resolve(ServingChoice(replicas=2), TI2V)
    assert (plan.spec.replicas, plan.spec.gpus, plan.spec.parallel.world_size) == (2, (0, 1), 1)
    assert plan.text.startswith("Recommended: 2 replicas x (1 GPU, no offload)")
    assert "laid out 2 times" in plan.text
    with pytest.raises(SpecError) as err:
        _resolve(ServingChoice(replicas=3), TI2V)
    assert err.value.setting == "replicas" and "3 replicas need at least 3 GPUs" in err.value.what


def test_auto_suggests_replicas_for_a_queued_batch_when_one_gpu_fits(monkeypatch):
    monkeypatch.setenv(GPU_MEMORY_ENV, "80,80")
    batch = _resolve(ServingChoice(), TI2V, queued_jobs=4)
    assert batch.spec.replicas == 1                      # suggested, not switched
    assert "4 jobs are queued and the model fits one GPU: replicas 2" in batch.text
    assert "replicas" not in _resolve(ServingChoice(), TI2V).text
    monkeypatch.setenv(GPU_MEMORY_ENV, "80")
    assert "jobs are queued" not in _resolve(ServingChoice(), TI2V, queued_jobs=4).text


def test_an_explicit_replica_that_does_not_fit_its_gpu_is_warned_about_or_refused(monkeypatch):
    choice = ServingChoice(parallel_mode="none", replicas=2, gpus="0,1")
    monkeypatch.setenv(GPU_MEMORY_ENV, "24,80")        # replica 0 loads on its 24 GiB, its default clip does not run
    plan = _resolve(choice, TI2V)
    assert plan.spec.replicas == 2
    (misfit,) = [w for w in plan.warnings if w.startswith("the memory plan says these settings do not fit: ")]
    assert "vs 24.0 GiB per GPU (GPU 0) " in misfit and plan.text == ""
    monkeypatch.setenv(GPU_MEMORY_ENV, "16,80")        # replica 0 cannot even load on its 16 GiB
    with pytest.raises(LauncherError, match=r"do not fit the GPUs: peak \S+ GiB vs 16.0 GiB per GPU \(GPU 0\)"):
        _resolve(choice, TI2V)


def test_the_oom_step_down_applies_to_every_replica(monkeypatch):
    monkeypatch.setenv(GPU_MEMORY_ENV, "40,40")
    plan = _resolve(ServingChoice(parallel_mode="none", replicas=2, gpus="0,1"), TI2V, auto_fallback=True)
    leaner, note = plan.fallback(plan.spec, failures.OOM_LOAD)
    assert (leaner.replicas, leaner.gpus, leaner.parallel.world_size) == (2, (0, 1), 1)
    assert leaner.memory != plan.spec.memory and note.endswith("(each of the 2 replicas)")
    leaner.validate(visible_gpus=2)


# --------------------------------------------------------------------------- the watch
PARENT = textwrap.dedent("""
    import multiprocessing, sys, time
    def child():
        time.sleep(600)
    if __name__ == "__main__":
        ctx = multiprocessing.get_context("spawn")
        procs = [ctx.Process(target=child) for _ in range(2)]
        for p in procs:
            p.start()
            time.sleep(0.3)                  # upstream starts its replicas one after the other
        ctx.Lock()                           # the resource tracker, a child that is not a replica
        print(" ".join(str(p.pid) for p in procs), flush=True)
        time.sleep(600)
""")


def test_the_watch_finds_the_replica_processes_and_names_the_dead_one(tmp_path):
    script = tmp_path / "parent.py"
    script.write_text(PARENT)
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                              start_new_session=True)
    try:
        kids = [int(p) for p in parent.stdout.readline().split()]
        watch = replica_watch.ReplicaWatch.find(parent.pid, 2)
        assert watch.complete and watch.pids() == kids and watch.dead() is None
        others = {c.pid for c in psutil.Process(parent.pid).children()} - set(kids)
        assert others, "the resource tracker is a child too, and is not counted"
        three = replica_watch.ReplicaWatch.find(parent.pid, 3)
        assert not three.complete and "2 of 3 replica processes" in replica_watch.missing_note(three)
        os.kill(kids[1], signal.SIGKILL)
        deadline = time.monotonic() + 10
        while watch.dead() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        dead = watch.dead()
        assert dead is not None and (dead.index, dead.pid) == (1, kids[1])
        err = replica_watch.replica_died(dead, 2, ["... the server's last lines ..."])
        assert err.kind == failures.CRASH and err.what == f"Replica 1 of 2 (pid {kids[1]}) died"
        assert "does not restart a dead replica" in err.why and "server's last lines" in err.raw
    finally:
        os.killpg(parent.pid, signal.SIGKILL)
        parent.wait(10)


def test_a_single_replica_server_has_nothing_to_watch():
    watch = replica_watch.ReplicaWatch.find(os.getpid(), 1)
    assert watch.complete and watch.pids() == [] and watch.dead() is None
    with pytest.raises(LauncherError):
        replicas.check(0, LaunchSpec(TI2V).family)
