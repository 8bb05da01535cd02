"""Guidance 1 and CFG parallel (issue 13): the planner ranks configurations for the guidance the jobs
run, an explicit CFG-parallel choice at guidance 1 is warned about (naming the widget and the better
choice), and Generate Video re-plans an `auto` server that would idle a GPU."""
from __future__ import annotations

import argparse
from typing import Any, Iterator, Optional

import pytest

from comfy_standin import ComfyStandIn
from vllm_omni_launcher.cli import generate_cmd
from vllm_omni_launcher.models import FAMILIES
from vllm_omni_launcher.nodes import progress, session
from vllm_omni_launcher.nodes.handles import ModelChoice, ServerHandle
from vllm_omni_launcher.planner.launch_plan import GPU_MEMORY_ENV, ServingChoice, resolve_launch
from vllm_omni_launcher.planner.speed_costs import cfg_runs, idle_cfg_warning, speed_cost
from vllm_omni_launcher.server import registry
from vllm_omni_launcher.server.config.local_config import LocalConfig
from vllm_omni_launcher.server.launch import versions
from vllm_omni_launcher.server.launch.spec import LaunchSpec, ParallelConfig
from vllm_omni_launcher.server.supervision.status import READY, Status

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
class _GpuServer:
    """The registry's Supervisor here: ready once started, at a port of its own; stands in for the GPU server only."""

    started: list[LaunchSpec] = []          # the fixture gives each test its own list

    def __init__(self, spec: LaunchSpec, config: Any, fallback: Any = None,
                 keep_alive_minutes: Optional[float] = None) -> None:
        self.spec = self.requested_spec = spec
        self.fallback, self.keep_alive_minutes, self.pgid, self.running = fallback, keep_alive_minutes, None, False
        self.url, self.api_key, self.server_version = f"http://127.0.0.1:{9000 + len(self.started)}", None, V30
        self.storage_dir: Optional[str] = None     # no job storage here: nothing is read from disk

    def start(self, on_status: Any = None, should_cancel: Any = None) -> None:
        self.started.append(self.spec)
        self.running = True

    def ready(self) -> bool:
        return self.running

    def stop(self, timeout: Optional[float] = None) -> None:
        self.running = False

    def status(self) -> Status:
        return Status(READY, f"Ready: {self.spec.served_name} at {self.url}", self.running, pid=None, port=None,
                      url=self.url, generation=1, fingerprint=self.spec.fingerprint())

    def listen(self, on_status: Any, replay: bool = False) -> None:
        return None

    def unlisten(self, on_status: Any) -> None:
        return None

    def mark_job_activity(self) -> None:
        return None


@pytest.fixture
def gpu_servers(tmp_path, monkeypatch) -> Iterator[list[LaunchSpec]]:
    """The launch path as Local Server and Generate run it (planner, registry) with _GpuServer for the servers,
    the pinned server line, and no left-behind server to adopt; yields the specs started, in order."""
    monkeypatch.setenv("VLLM_OMNI_LAUNCHER_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setattr(versions, "checked_server_version", lambda config: V30)
    monkeypatch.setattr(registry, "Supervisor", _GpuServer)
    monkeypatch.setattr(_GpuServer, "started", [])
    with ComfyStandIn():
        yield _GpuServer.started
        registry.stop_all()


def _local_server(mode: str) -> ServerHandle:
    """Local Server's handle for A14B on the two cards (no queued prompt: its jobs are taken to run CFG)."""
    serving = ServingChoice(parallel_mode=mode)   # type: ignore[arg-type]
    return session.start_local(ModelChoice(A14B.hf_id, A14B.key), serving, "3")


def _generate(handle: ServerHandle, cfg: bool) -> Any:
    """The server a Generate job with (or without) CFG gets for the handle (session.job_client, as run_jobs)."""
    client, sup = session.job_client(handle, progress.NodeReporter("7"), cfg=cfg)
    client.close()
    return sup


def _mode(sup: Any) -> str:
    return sup.spec.parallel.mode


def test_generate_at_guidance_1_replans_an_auto_cfg_server_once_and_keeps_using_the_new_one(gpu_servers):
    handle = _local_server("auto")
    assert [spec.parallel.mode for spec in gpu_servers] == ["cfg"]
    assert _mode(_generate(handle, cfg=True)) == "cfg" and len(gpu_servers) == 1     # CFG on: kept
    ulysses = _generate(handle, cfg=False)
    assert _mode(ulysses) == "ulysses" and [spec.parallel.mode for spec in gpu_servers] == ["cfg", "ulysses"]
    assert registry.all_servers() == [ulysses]                  # the CFG server gave its GPUs to it
    for cfg in (False, True):          # the same cached handle: the re-planned server, no new launch
        assert _generate(handle, cfg=cfg) is ulysses
    assert len(gpu_servers) == 2
    # the registry answers for the handle: its reports and its stop reach the re-planned server
    assert registry.find(handle.server_id) is ulysses
    _, note = session.build_request(handle, prompt="a fox", guidance=1.0, guidance_2=1.0)
    assert note == ""                                            # auto re-plans instead of warning
    (report,) = session.server_report(handle, None)
    assert ulysses.url in report and "not running" not in report
    assert session.stop_servers(handle, False, None) == (f"Stopped the server for {handle.served_name}.",)
    assert not ulysses.ready() and registry.find(handle.server_id) is None
    assert _mode(_generate(handle, cfg=True)) == "cfg"           # started again from the handle's own plan
    assert [spec.parallel.mode for spec in gpu_servers] == ["cfg", "ulysses", "cfg"]


def test_generate_at_guidance_1_on_an_explicit_cfg_server_keeps_it_and_notes_the_better_choice(gpu_servers):
    handle = _local_server("cfg")
    cfg_server = registry.find(handle.server_id)
    assert _generate(handle, cfg=False) is cfg_server and _mode(cfg_server) == "cfg"
    assert len(gpu_servers) == 1                                 # an explicit choice is never re-planned
    _, note = session.build_request(handle, prompt="a fox", guidance=1.0, guidance_2=1.0)
    assert "CFG parallel does nothing at guidance 1" in note and "parallel_mode to ulysses" in note


def test_a_replan_record_is_followed_while_its_server_runs_and_never_by_a_launch_of_the_spec_asked_for(gpu_servers):
    cfg_spec = LaunchSpec(A14B.hf_id, gpus=(0, 1), parallel=ParallelConfig("cfg", 2, 2))
    uly_spec = LaunchSpec(A14B.hf_id, gpus=(0, 1), parallel=ParallelConfig("ulysses", 2, 2))
    cfg_server = registry.get_or_start(cfg_spec)
    assert registry.find(cfg_spec.fingerprint()) is cfg_server
    uly_server = registry.get_or_start(uly_spec)                 # overlapping GPUs: the CFG server stops
    registry.replan(cfg_spec.fingerprint(), uly_spec.fingerprint())
    assert registry.find(cfg_spec.fingerprint()) is uly_server is registry.find(uly_spec.fingerprint())
    # a launch of the spec asked for (Local Server queued again) starts that spec, and the record ends with the
    # server it named
    again = registry.get_or_start(cfg_spec)
    assert again.spec == cfg_spec and not uly_server.ready() and registry.find(cfg_spec.fingerprint()) is again
    registry.replan(cfg_spec.fingerprint(), uly_spec.fingerprint())
    assert registry.find(cfg_spec.fingerprint()) is None         # it names no running server: planned again
    registry.replan(cfg_spec.fingerprint(), cfg_spec.fingerprint())       # a re-plan back to the handle's own
    assert registry.find(cfg_spec.fingerprint()) is again


# ----------------------------------------------------------------------------- Local Server reads the queued prompt
def test_local_server_asks_comfyui_for_the_queued_prompt():
    from vllm_omni_launcher.nodes import NODES

    assert "prompt" in NODES["VLLMOmniLocalServer"].hidden
