"""A step-distilled ("dmd") pipeline never runs CFG: its server forces guidance 1 and drops the negative
prompt whatever the request sends. So its memory plan holds no CFG branch, whatever the request's
guidance says, and a CFG-parallel spec for it is called out as idling a GPU; a pipeline that does run
CFG keeps the branch."""
from __future__ import annotations

from vllm_omni_launcher.models import FAMILIES
from vllm_omni_launcher.models.families import PIPELINE_FAMILIES
from vllm_omni_launcher.planner.memory import RequestShape, plan
from vllm_omni_launcher.server.launch.spec import LaunchSpec, ParallelConfig

CARD_GIB = 80.0
HF_ID = {key: family.hf_id for key, family in {**FAMILIES, **PIPELINE_FAMILIES}.items()}


def _plan(key: str, cfg: bool, spec: LaunchSpec | None = None):
    spec = spec or LaunchSpec(HF_ID[key], gpus=(0,))
    return plan(spec, RequestShape(1280, 704, 121, cfg=cfg), [CARD_GIB] * len(spec.gpus),
                host_available_gib=None, server_version=(0, 30))


def _terms(result) -> list:
    return [[t.to_dict() for t in gpu.terms] for gpu in result.gpus]


def test_fastwan_plan_with_cfg_asked_equals_its_plan_without_cfg():
    asked, off = _plan("fastwan_ti2v_5b", cfg=True), _plan("fastwan_ti2v_5b", cfg=False)
    assert all(t.name != "CFG" for gpu in asked.gpus for t in gpu.terms)
    assert _terms(asked) == _terms(off)
    assert [gpu.phases for gpu in asked.gpus] == [gpu.phases for gpu in off.gpus]
    assert asked.peak_gib == off.peak_gib


def test_a_pipeline_that_runs_cfg_still_counts_its_branch():
    with_cfg, off = _plan("ti2v_5b", cfg=True), _plan("ti2v_5b", cfg=False)
    cfg = [t for t in with_cfg.gpus[0].terms if t.name == "CFG"]
    assert len(cfg) == 1 and cfg[0].gib > 0 and cfg[0].phase == "denoise"
    assert with_cfg.gpus[0].phases["denoise"] > off.gpus[0].phases["denoise"]


def test_cfg_parallel_for_fastwan_is_noted_as_idling_the_second_gpu():
    spec = LaunchSpec(HF_ID["fastwan_ti2v_5b"], gpus=(0, 1), parallel=ParallelConfig("cfg", 2))
    notes = _plan("fastwan_ti2v_5b", cfg=True, spec=spec).notes
    assert any("CFG parallel with CFG off" in note and "ulysses" in note for note in notes), notes
