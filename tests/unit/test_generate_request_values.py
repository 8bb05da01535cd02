"""The values Generate Video sends: request_for fills the model's defaults where a widget asks for
them (0 / -1) and keeps real zeros, a serving plan's size limit applies only there, and a
CFG-parallel server meeting guidance 1 gets a note that one GPU idles.
"""
from __future__ import annotations

import pytest

from vllm_omni_launcher.errors import LauncherError
from vllm_omni_launcher.models import FAMILIES, request_for
from vllm_omni_launcher.nodes import session
from vllm_omni_launcher.nodes.handles import ServerHandle


def test_request_for_fills_the_models_values_where_asked_and_keeps_real_zeros():
    t2v = FAMILIES["t2v_a14b"]
    req = request_for(t2v, prompt="a fox", width=0, height=0, frames=0, fps=0, steps=0, guidance=-1,
                      guidance_2=-1, boundary_ratio=-1, flow_shift=-1, seed=3, negative_prompt="")
    assert (req.width, req.height, req.num_frames, req.fps, req.steps) == (832, 480, 81, 16.0, 40)
    assert (req.guidance, req.guidance_2, req.boundary_ratio, req.flow_shift) == (4.0, 3.0, 0.875, 12.0)
    assert req.negative_prompt is None and req.seed == 3
    assert request_for(t2v, prompt="a fox") == request_for(t2v, prompt="a fox", frames=None)   # CLI: None
    ti2v = request_for(FAMILIES["ti2v_5b"], prompt="x", guidance=0.0, guidance_2=7.0, boundary_ratio=0.5)
    assert ti2v.guidance == 0.0 and ti2v.guidance_2 is None and ti2v.boundary_ratio is None   # one expert
    with pytest.raises(LauncherError) as err:
        request_for(t2v, prompt="  ")
    assert err.value.setting == "prompt"
    with pytest.raises(LauncherError) as err:
        request_for(FAMILIES["i2v_a14b"], prompt="x")
    assert err.value.setting == "image"


def test_a_plan_limit_applies_only_where_generate_asks_for_the_models_value():
    from vllm_omni_launcher.nodes.handles import RequestLimit

    limit = RequestLimit(1280, 704, 113, "the serving plan fits 1280x704x113, not the model's 1280x704x121")
    widgets, note = limit.apply({"width": 0, "height": 0, "frames": 0, "seed": 1})   # what build_request applies
    assert (widgets["width"], widgets["height"], widgets["frames"]) == (1280, 704, 113)
    assert note.startswith("width, height, frames from the serving plan")
    kept, note = limit.apply({"width": 640, "height": 0, "frames": 81})
    assert kept == {"width": 640, "height": 0, "frames": 81} and note == ""


@pytest.mark.parametrize("mode, guidance, guidance_2, warned", [
    ("cfg", 1.0, 1.0, True),          # distill settings on a CFG-parallel server: one GPU idles
    ("cfg", 4.0, 3.0, False),         # real CFG: both GPUs work
    ("cfg", None, None, False),       # the server's default guidance is not known to be 1
    ("ulysses", 1.0, 1.0, False),     # no CFG parallel, nothing idles
])
def test_generate_notes_an_idle_gpu_when_cfg_parallel_meets_guidance_1(monkeypatch, mode, guidance, guidance_2,
                                                                       warned):
    from types import SimpleNamespace

    from vllm_omni_launcher.server.launch.spec import LaunchSpec, ParallelConfig

    spec = LaunchSpec(model=FAMILIES["t2v_a14b"].hf_id, parallel=ParallelConfig(mode=mode, degree=2))
    monkeypatch.setattr(session.registry, "find", lambda server_id: SimpleNamespace(spec=spec))
    handle = ServerHandle("local", "http://127.0.0.1:1", spec.model, "t2v_a14b", server_id=spec.fingerprint())
    _, note = session.build_request(handle, prompt="a fox", guidance=guidance, guidance_2=guidance_2)
    assert (("CFG parallel does nothing at guidance 1" in note and "parallel_mode to ulysses" in note)
            if warned else note == "")
