"""`plan`'s "not X" reasons are for the request they are printed under: the planner's retries at
smaller sizes never rewrite them, so a rung's GPU need is the same whatever the host RAM and
matches the breakdown of that configuration printed above it."""
from __future__ import annotations

import re

import pytest

from vllm_omni_launcher.cli import main
from vllm_omni_launcher.planner.ladder import recommend
from vllm_omni_launcher.planner.memory import RequestShape, plan
from vllm_omni_launcher.server.launch.spec import LaunchSpec

T2V = "Wan-AI/Wan2.2-T2V-A14B-Diffusers"
NOT_LINE = re.compile(r"^  not (1 GPU, no offload)(?: at (\S+))?: GPU 0 needs ([\d.]+) GiB", re.M)


def _plan_text(capsys, host_ram: str) -> str:
    main(["plan", "--model", T2V, "--gpu-memory", "48", "--host-ram", host_ram])
    return capsys.readouterr().out


def test_a_rungs_gpu_need_does_not_change_with_host_ram(capsys):
    low, high = _plan_text(capsys, "20"), _plan_text(capsys, "200")
    assert "No configuration fits" in low and "Recommended: 1 GPU + layerwise offload" in high
    need_low = NOT_LINE.search(low).group(3)
    need_high = NOT_LINE.search(high).group(3)
    assert need_low == need_high


def test_the_reason_matches_the_breakdown_printed_above_it(capsys):
    text = _plan_text(capsys, "20")
    breakdown = re.search(r"rank 0 on GPU 0 .*?: peak ([\d.]+) GiB", text).group(1)
    m = NOT_LINE.search(text)
    assert m.group(3) == breakdown                    # the given launch options are "1 GPU, no offload"
    assert m.group(2) == "832x480x81"                  # nothing fits: the line says which request it is for


@pytest.mark.parametrize("asked,gpu,reduced_to", [
    (RequestShape(width=1280, height=720, frames=81), 24.0, "1280x720x77"),     # fewer frames: the most any rung fits
    (RequestShape(width=1920, height=1088, frames=81), 16.0, "768x432x81"),     # smaller frames: every rung retried
])
def test_rejected_rungs_keep_the_asked_requests_plan_when_the_request_is_reduced(asked, gpu, reduced_to):
    rec = recommend(LaunchSpec(model=T2V), asked, gpus=[gpu], host_available_gib=200.0)
    assert rec.reduced and rec.spec is not None and rec.request.label() == reduced_to
    assert rec.rejected
    for r in rec.rejected:
        fresh = plan(r.spec, asked, rec.gpus, host_available_gib=200.0)
        assert r.plan.request == asked and r.plan.peak_gib == pytest.approx(fresh.peak_gib)
    text = rec.text()
    assert all(f" at {asked.label()}: " in line for line in text.splitlines() if line.startswith("  not "))
