"""The recommendation's text names at most SHOWN_REJECTED rejected configurations one by one (the last in ladder
order: just faster than the pick, or the leanest when nothing fits) and sums up the faster ones in one line;
`plan --json` keeps every one with its reason."""
from __future__ import annotations

import json
import re

from vllm_omni_launcher.cli import main
from vllm_omni_launcher.planner.ladder import recommend
from vllm_omni_launcher.planner.recommendation import SHOWN_REJECTED
from vllm_omni_launcher.server.launch.spec import LaunchSpec

T2V = "Wan-AI/Wan2.2-T2V-A14B-Diffusers"


def test_two_small_gpus_with_little_host_ram_get_a_short_list_ending_with_the_leanest():
    rec = recommend(LaunchSpec(model=T2V), gpus=[24, 24], host_available_gib=20)
    assert rec.spec is None and len(rec.rejected) > SHOWN_REJECTED
    text = rec.text()
    named = re.findall(r"^  not (.+) at 832x480x81: ", text, re.M)
    assert named == [r.label for r in rec.rejected[-SHOWN_REJECTED:]]
    hidden = len(rec.rejected) - SHOWN_REJECTED
    assert f"  not {hidden} faster configurations ({rec.rejected[0].label} first): none fits either" in text


def test_a_short_rejected_list_is_named_whole():
    rec = recommend(LaunchSpec(model=T2V), gpus=[48, 48], host_available_gib=256)
    assert 0 < len(rec.rejected) <= SHOWN_REJECTED
    assert "faster configurations (" not in rec.text()
    assert re.findall(r"^  not (.+?): ", rec.text(), re.M) == [r.label for r in rec.rejected]


def test_plan_json_keeps_every_rejected_configuration(capsys):
    main(["plan", "--model", T2V, "--gpu-memory", "24,24", "--host-ram", "20", "--json"])
    rejected = json.loads(capsys.readouterr().out)["recommendation"]["rejected"]
    assert len(rejected) == len(recommend(LaunchSpec(model=T2V), gpus=[24, 24], host_available_gib=20).rejected)
    assert all(r["why_not"] for r in rejected)


def test_a_fitting_pick_names_the_rejected_just_faster_than_it():
    rec = recommend(LaunchSpec(model=T2V), gpus=[24, 24], host_available_gib=256)
    assert rec.spec is not None and len(rec.rejected) > SHOWN_REJECTED
    named = re.findall(r"^  not (.+?): ", rec.text(), re.M)
    assert rec.reason.endswith(f"the {len(rec.rejected)} faster configurations below do not fit")
    assert named[0].startswith(f"{len(rec.rejected) - SHOWN_REJECTED} faster configurations")
    assert named[1:] == [r.label for r in rec.rejected[-SHOWN_REJECTED:]]
