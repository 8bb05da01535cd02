"""When nothing fits the request, `recommend` shrinks it to the most frames any rung fits (the fastest of the
rungs that fit as many). It searches each rung only above the best count so far, so a rung that cannot beat it
costs one plan instead of a full search; the rung it picks is the one a full search of every rung picks."""
from __future__ import annotations

from typing import Optional

import pytest

from vllm_omni_launcher.planner import ladder
from vllm_omni_launcher.planner.gpus import hypothetical_gpus
from vllm_omni_launcher.planner.ladder import _max_frames, build_ladder, recommend
from vllm_omni_launcher.planner.memory import RequestShape
from vllm_omni_launcher.planner.model_sizes import model_sizes
from vllm_omni_launcher.planner.peer_links import exchanges_every_layer, p2p_links
from vllm_omni_launcher.server.launch.spec import LaunchSpec

T2V = "Wan-AI/Wan2.2-T2V-A14B-Diffusers"
TI2V = "Wan-AI/Wan2.2-TI2V-5B-Diffusers"
VACE_1_3B = "Wan-AI/Wan2.1-VACE-1.3B-diffusers"
MIN_FRAMES = 17      # recommend's default

# (model, request, GPU sizes, p2p, host RAM GiB): each shrinks the frames, and a full search finds rungs that
# fit fewer frames before the winner (VACE: 49, 65, 161, ... then 197; T2V: 161 then 197), or, without P2P,
# nothing in the first tier (TI2V: only tensor parallel fits, in the last tier)
SHRINK_CASES = [
    pytest.param(VACE_1_3B, RequestShape(1280, 704, 241), [24.0, 24.0], None, 256.0, id="vace-2x24-many-rungs"),
    pytest.param(T2V, RequestShape(1280, 704, 241), [48.0], None, 256.0, id="t2v-1x48-later-rung-wins"),
    pytest.param(TI2V, RequestShape(1280, 704, 121), [24.0, 24.0], False, 1.0, id="ti2v-no-p2p-last-tier"),
]


def _full_search(model: str, req: RequestShape, sizes_gib: list[float], p2p: Optional[bool],
                 host: float) -> tuple[str, int]:
    """The winner as every rung of every tier searched from 1 frame picks it: the tiers in order, in a tier
    the most frames (at least MIN_FRAMES), the first rung of those that fit as many."""
    gpus, sizes = hypothetical_gpus(sizes_gib), model_sizes(model)
    rungs, _ = build_ladder(LaunchSpec(model), gpus, req, p2p=p2p)
    for tier in p2p_links(gpus, p2p).tiers(rungs):
        found = [(_max_frames(r.spec, req, gpus, sizes, host, None, limit=req.frames), r) for r in tier]
        found = [(mf, r) for mf, r in found if mf is not None and mf >= min(MIN_FRAMES, req.frames)]
        if found:
            most = max(mf for mf, _ in found)
            return next(r.label for mf, r in found if mf == most), most
    raise AssertionError("the case must shrink to a count some rung fits")


@pytest.mark.parametrize("model, req, sizes_gib, p2p, host", SHRINK_CASES)
def test_a_shrunk_request_gets_the_rung_a_full_search_of_every_rung_picks(model, req, sizes_gib, p2p, host):
    rec = recommend(model, req, sizes_gib, p2p=p2p, host_available_gib=host, min_frames=MIN_FRAMES)
    assert rec.reduced and rec.request.frames < req.frames, rec.text()
    assert (rec.label, rec.request.frames) == _full_search(model, req, sizes_gib, p2p, host)
    assert rec.max_frames == rec.request.frames and "fits the most frames there" in rec.reason
    if p2p is False:
        assert exchanges_every_layer(rec.spec) and "peer-to-peer" in rec.reason


@pytest.mark.parametrize("model, req, sizes_gib, p2p, host", SHRINK_CASES)
def test_a_rung_searched_above_a_count_finds_its_own_most_or_nothing_with_one_plan(
        model, req, sizes_gib, p2p, host, monkeypatch):
    gpus, sizes = hypothetical_gpus(sizes_gib), model_sizes(model)
    plans: list[int] = []
    plan = ladder.plan

    def counted(*args, **kwargs):
        plans.append(args[1].frames)
        return plan(*args, **kwargs)

    monkeypatch.setattr(ladder, "plan", counted)
    for r in build_ladder(LaunchSpec(model), gpus, req, p2p=p2p)[0]:
        most = _max_frames(r.spec, req, gpus, sizes, host, None, limit=req.frames)
        for above in (0, 16, 57, 100, 160, 196, req.frames, most or 0):     # its own most: a tie is not more
            plans.clear()
            found = _max_frames(r.spec, req, gpus, sizes, host, None, limit=req.frames, above=above)
            if most is not None and most > above:
                assert found == most, (r.label, above)
            else:
                assert found is None and len(plans) <= 1, (r.label, above, plans)
