"""Guidance 1 and CFG parallel (issue 13): the planner ranks configurations for the guidance the jobs
run, an explicit CFG-parallel choice at guidance 1 is warned about (naming the widget and the better
choice), and Generate Video re-plans an `auto` server that would idle a GPU."""
from __future__ import annotations

import argparse
from types import SimpleNamespace

import pytest

from vllm_omni_launcher.cli import generate_cmd
from vllm_omni_launcher.models import FAMILIES
from vllm_omni_launcher.nodes import session
from vllm_omni_launcher.nodes.handles import ModelChoice, ServerHandle
from vllm_omni_launcher.planner.launch_plan import GPU_MEMORY_ENV, ServingChoice, resolve_launch
from vllm_omni_launcher.planner.speed_costs import cfg_runs, idle_cfg_warning, speed_cost
from vllm_omni_launcher.server.config.local_config import LocalConfig
from vllm_omni_launcher.server.launch.spec import LaunchSpec, ParallelConfig

A14B = FAMILIES["t2v_a14b"]
V30 = (0, 30)


@pytest.fixture(autouse=True)
def _two_h200s(tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_OMNI_LAUNCHER_CONFIG", str(tmp_path / "none.json"))
    monkeypatch.setenv(GPU_MEMORY_ENV, "141,141")


def _plan(mode: str, cfg: bool):
    choice = ServingChoice(parallel_mode=mode)   # type: ignore[arg-type]
    config = LocalConfig()
    return resolve_launch(choice.base_spec(A14B.hf_id, config), config, gpus=choice.gpus, auto=mode == "auto",
                          server_version=V30, cfg=cfg)


@pytest.mark.parametrize("guidance, guidance_2, runs", [
    (None, None, True),        # not sent: the pipeline's default guidance is 4
    (1.0, None, False),        # TI2V, or A14B without guidance_2: upstream uses guidance for both experts
    (1.0, 1.0, False),         # the 4-step distill settings
    (0.5, 1.0, False),
    (1.0, 3.0, True),          # the low-noise expert still runs CFG
    (5.0, 1.0, True),
])
def test_cfg_runs_only_when_some_expert_has_guidance_above_1(guidance, guidance_2, runs):
    assert cfg_runs(guidance, guidance_2) is runs


def test_cfg_parallel_without_cfg_costs_one_gpu_of_speed():
    cfg = LaunchSpec(A14B.hf_id, gpus=(0, 1), parallel=ParallelConfig("cfg", 2, 2))
    uly = LaunchSpec(A14B.hf_id, gpus=(0, 1), parallel=ParallelConfig("ulysses", 2, 2))
    # one GPU's denoise; its VAE patch decode (tiled, on two ranks) is what differs (0.30 costs)
    assert speed_cost(cfg, cfg=False) == pytest.approx(speed_cost(LaunchSpec(A14B.hf_id)), rel=0.05)
    assert speed_cost(cfg) < speed_cost(uly) < speed_cost(cfg, cfg=False)


def test_auto_at_guidance_1_picks_ulysses_on_two_gpus():
    plan = _plan("auto", cfg=cfg_runs(1.0, 1.0))
    assert plan.spec.parallel.mode == "ulysses" and plan.spec.parallel.degree == 2
    assert "CFG parallel" not in plan.text.split("\n")[0]
    assert not any("CFG parallel does nothing" in w for w in plan.warnings)


def test_auto_at_guidance_5_picks_cfg_parallel():
    plan = _plan("auto", cfg=cfg_runs(5.0, 5.0))
    assert plan.spec.parallel.mode == "cfg" and plan.spec.parallel.degree == 2


def test_explicit_cfg_at_guidance_1_warns_naming_the_widget_and_the_better_choice():
    plan = _plan("cfg", cfg=False)
    assert plan.spec.parallel.mode == "cfg"                       # the user's choice is kept
    (warning,) = [w for w in plan.warnings if "CFG parallel does nothing at guidance 1" in w]
    assert "parallel_mode to ulysses" in warning and "--parallel ulysses=2" in warning
    assert not any("CFG parallel does nothing" in w for w in _plan("cfg", cfg=True).warnings)
    assert idle_cfg_warning(LaunchSpec(A14B.hf_id, gpus=(0, 1), parallel=ParallelConfig("ulysses", 2, 2)),
                            False) == ""


def test_cli_generate_plans_for_the_guidance_its_request_will_carry():
    def args(guidance, guidance_2):
        return argparse.Namespace(model=A14B.hf_id, prompt="a cat", guidance=guidance, guidance_2=guidance_2)

    assert generate_cmd._runs_cfg(args(1.0, 1.0)) is False
    assert generate_cmd._runs_cfg(args(1.0, None)) is True          # guidance_2 takes the model's 3.0
    assert generate_cmd._runs_cfg(args(None, None)) is True


# ----------------------------------------------------------------------------- Generate re-plans auto servers
class _Sup:
    def __init__(self, spec: LaunchSpec):
        self.spec = spec

    def ready(self) -> bool:
        return True


def _handle(mode: str, spec: LaunchSpec) -> ServerHandle:
    return ServerHandle("local", "http://127.0.0.1:1", spec.model, A14B.key, server_id=spec.fingerprint(),
                        model=ModelChoice(A14B.hf_id, A14B.key), serving=ServingChoice(parallel_mode=mode))   # type: ignore[arg-type]


def test_generate_at_guidance_1_replans_an_auto_cfg_server_once_and_keeps_using_the_new_one(monkeypatch):
    cfg_spec = LaunchSpec(A14B.hf_id, gpus=(0, 1), parallel=ParallelConfig("cfg", 2, 2))
    uly_spec = LaunchSpec(A14B.hf_id, gpus=(0, 1), parallel=ParallelConfig("ulysses", 2, 2))
    running = {cfg_spec.fingerprint(): _Sup(cfg_spec)}
    launches: list[bool] = []

    def launch(model, serving, config, reporter, cfg=True, queued_jobs=1):
        launches.append(cfg)
        spec = cfg_spec if cfg else uly_spec
        running.pop(cfg_spec.fingerprint(), None)                  # the GPUs are taken over
        running[spec.fingerprint()] = _Sup(spec)
        return running[spec.fingerprint()], SimpleNamespace(spec=spec), None

    monkeypatch.setattr(session.registry, "find", running.get)
    monkeypatch.setattr(session, "launch_local", launch)
    monkeypatch.setattr(session, "_REPLANNED", {})
    reporter = SimpleNamespace(texts=[], text=lambda t: reporter.texts.append(t))
    handle = _handle("auto", cfg_spec)

    assert session._running_local(handle, LocalConfig(), reporter, cfg=True).spec == cfg_spec   # CFG on: kept
    assert launches == []
    assert session._running_local(handle, LocalConfig(), reporter, cfg=False).spec == uly_spec
    assert launches == [False] and "plans again" in reporter.texts[-1]
    for cfg in (False, True):          # the same cached handle: the re-planned server, no new launch
        assert session._running_local(handle, LocalConfig(), reporter, cfg=cfg).spec == uly_spec
    assert launches == [False]
    request = SimpleNamespace(guidance=1.0, guidance_2=1.0)
    assert session._idle_cfg_note(handle, request) == ""       # auto re-plans instead of warning


def test_generate_at_guidance_1_on_an_explicit_cfg_server_keeps_it_and_notes_the_better_choice(monkeypatch):
    cfg_spec = LaunchSpec(A14B.hf_id, gpus=(0, 1), parallel=ParallelConfig("cfg", 2, 2))
    monkeypatch.setattr(session.registry, "find", {cfg_spec.fingerprint(): _Sup(cfg_spec)}.get)
    monkeypatch.setattr(session, "launch_local", lambda *a, **k: pytest.fail("an explicit choice is never re-planned"))
    monkeypatch.setattr(session, "_REPLANNED", {})
    handle = _handle("cfg", cfg_spec)
    reporter = SimpleNamespace(text=lambda t: None)
    assert session._running_local(handle, LocalConfig(), reporter, cfg=False).spec == cfg_spec
    note = session._idle_cfg_note(handle, SimpleNamespace(guidance=1.0, guidance_2=1.0))
    assert "CFG parallel does nothing at guidance 1" in note and "parallel_mode to ulysses" in note


# ----------------------------------------------------------------------------- Local Server reads the queued prompt
def test_local_server_asks_comfyui_for_the_queued_prompt():
    from vllm_omni_launcher.nodes import NODES

    assert "prompt" in NODES["VLLMOmniLocalServer"].hidden
