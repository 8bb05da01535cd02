"""The Local Server node's text gives the launch plan's warnings (LaunchPlan.report), not only its text: an
explicit CFG-parallel server for jobs that run no CFG says that the second GPU idles and what to set
instead, and a warning the plan text already gives (an auto plan lists its configuration's) is said once."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from comfy_standin import ComfyStandIn, run_node
from queued_prompts import queued_prompt, video_node
from vllm_omni_launcher.models import FAMILIES
from vllm_omni_launcher.nodes.handles import ModelChoice
from vllm_omni_launcher.planner.launch_plan import GPU_MEMORY_ENV, LaunchPlan, ServingChoice
from vllm_omni_launcher.server import registry
from vllm_omni_launcher.server.launch import versions
from vllm_omni_launcher.server.launch.spec import LaunchSpec

A14B = FAMILIES["t2v_a14b"]
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


def test_a_warning_the_plan_text_already_gives_is_said_once():
    fp8 = "FP8 for Wan2.2 is not validated upstream"
    plan = LaunchPlan(LaunchSpec(A14B.hf_id), f"Recommended: one GPU\nwarning: {fp8}", None,
                      warnings=[fp8, "the second GPU idles"])
    assert plan.report().splitlines() == ["Recommended: one GPU", f"warning: {fp8}", "warning: the second GPU idles"]
    assert LaunchPlan(LaunchSpec(A14B.hf_id), "", None).report() == ""
