"""The Local Server node's text gives the launch plan's warnings (LaunchPlan.report), not only its text: an
explicit CFG-parallel server for jobs that run no CFG says that the second GPU idles and what to set
instead. The plan's text is the recommendation alone; every warning (the recommended configuration's,
the spec's, the jobs', explicit settings that do not fit) is in `LaunchPlan.warnings` and said once."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from comfy_standin import ComfyStandIn, run_node
from queued_prompts import queued_prompt, video_node
from vllm_omni_launcher.models import FAMILIES
from vllm_omni_launcher.nodes.handles import ModelChoice
from vllm_omni_launcher.planner.launch_plan import GPU_MEMORY_ENV, LaunchPlan, ServingChoice, resolve_launch
from vllm_omni_launcher.server import registry
from vllm_omni_launcher.server.config.local_config import LocalConfig
from vllm_omni_launcher.server.launch import versions
from vllm_omni_launcher.server.launch.spec import LaunchSpec

A14B, TI2V = FAMILIES["t2v_a14b"], FAMILIES["ti2v_5b"]
IDLE_GPU = "warning: CFG parallel does nothing at guidance 1 (no CFG)"


class _ReadyServer:
    """What registry.get_or_start returns once the server is ready; stands in for the GPU server only."""

    def __init__(self, spec: LaunchSpec) -> None:
        self.spec, self.url, self.server_version = spec, "http://127.0.0.1:8091", versions.DEFAULT_VERSION

    def status(self) -> SimpleNamespace:
        return SimpleNamespace(text=f"Ready: {self.spec.served_name} at {self.url}", fallback_note="")


@pytest.fixture
def two_80s_and_a_ready_server(monkeypatch) -> list[LaunchSpec]:
    """Two 80 GiB cards (the planner's sizes), the pinned server line, and a server that is ready at once."""
    started: list[LaunchSpec] = []
    monkeypatch.setenv(GPU_MEMORY_ENV, "80,80")
    monkeypatch.setattr(versions, "checked_server_version", lambda config: versions.DEFAULT_VERSION)
    monkeypatch.setattr(registry, "get_or_start",
                        lambda spec, config, **kw: started.append(spec) or _ReadyServer(spec))
    return started


def test_an_explicit_cfg_server_for_guidance_1_jobs_says_the_second_gpu_idles(two_80s_and_a_ready_server):
    prompt = queued_prompt(**{"10": video_node(guidance=1.0, guidance_2=1.0)})      # the distill template's values
    with ComfyStandIn() as comfy:
        run_node("VLLMOmniLocalServer", model=ModelChoice(A14B.hf_id, A14B.key),
                 serving=ServingChoice(gpus="0,1", parallel_mode="cfg"), unique_id="3", prompt=prompt)
    assert [spec.parallel.mode for spec in two_80s_and_a_ready_server] == ["cfg"]    # warned, not changed
    final = comfy.texts[-1][0]
    assert final.startswith("Ready: ") and final.count(IDLE_GPU) == 1
    assert "parallel_mode to ulysses" in final


def test_the_report_is_the_text_then_one_line_per_warning():
    plan = LaunchPlan(LaunchSpec(A14B.hf_id), "Recommended: one GPU\n  why: it fits", None,
                      warnings=["FP8 for Wan2.2 is not validated upstream", "the second GPU idles"])
    assert plan.report().splitlines() == ["Recommended: one GPU", "  why: it fits",
                                          "warning: FP8 for Wan2.2 is not validated upstream",
                                          "warning: the second GPU idles"]
    assert LaunchPlan(LaunchSpec(A14B.hf_id), "", None).report() == ""


def _said_once(report: str, warnings: list[str]) -> None:
    """Each warning is one `warning:` line of the report, and no other line is a warning."""
    lines = report.splitlines()
    assert [ln for ln in lines if ln.lower().startswith("warning")] == [f"warning: {w}" for w in warnings]
    assert len(set(warnings)) == len(warnings)


def test_a_spec_warning_and_an_explicit_fit_warning_are_each_said_once_on_the_node(two_80s_and_a_ready_server,
                                                                                    monkeypatch):
    monkeypatch.setenv(GPU_MEMORY_ENV, "24")      # TI2V-5B loads in 24 GiB; its default clip does not run in it
    serving = ServingChoice(gpus="0", parallel_mode="none", fp8=True)
    plan = serving.resolve(TI2V.hf_id, LocalConfig())
    spec_warning, misfit = plan.warnings
    assert spec_warning.startswith("FP8 for Wan2.2 is not validated upstream")
    assert misfit.startswith("the memory plan says these settings do not fit: ")
    assert plan.text == ""
    _said_once(plan.report(), plan.warnings)
    with ComfyStandIn() as comfy:
        run_node("VLLMOmniLocalServer", model=ModelChoice(TI2V.hf_id, TI2V.key), serving=serving, unique_id="3",
                 prompt=queued_prompt(**{"10": video_node()}))
    final = comfy.texts[-1][0]            # the node plans for its prompt's jobs: the same two warnings
    shown = [ln for ln in final.splitlines() if ln.lower().startswith("warning")]
    assert final.startswith("Ready: ") and len(shown) == 2
    assert shown[0] == f"warning: {spec_warning}" and shown[1].startswith(f"warning: {misfit[:40]}")


def test_an_auto_plans_text_carries_no_warning_and_its_configurations_are_said_once(monkeypatch):
    """The fast FP8 rung's warnings include its spec's FP8 warning, which the launch's spec check gives again."""
    monkeypatch.setenv(GPU_MEMORY_ENV, "141")
    serving = ServingChoice(speed="fast")
    plan = resolve_launch(serving.base_spec(TI2V.hf_id, LocalConfig()), LocalConfig(), auto=True, speed="fast",
                          server_version=(0, 30))
    assert plan.spec.memory.quantization == "fp8" and plan.text.startswith("Recommended: ")
    assert not any(ln.lower().startswith("warning") for ln in plan.text.splitlines())
    assert [w for w in plan.warnings if w.startswith("FP8 for Wan2.2 is not validated upstream")] == \
        [w for w in plan.spec.validate() if w.startswith("FP8 for")]
    assert any(w.startswith("speed fast: FP8 DiT weights") for w in plan.warnings)
    _said_once(plan.report(), plan.warnings)
