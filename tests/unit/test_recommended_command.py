"""The recommended command is what a launch runs: `vllm serve MODEL --omni ...` (without `--omni` vLLM never hands
over to vLLM-Omni), in `plan`'s text and JSON alike, rendered as `argv` renders the same spec."""
from __future__ import annotations

import json
import shlex

from vllm_omni_launcher.cli import main
from vllm_omni_launcher.planner.launch_plan import GPU_MEMORY_ENV
from vllm_omni_launcher.planner.ladder import recommend
from vllm_omni_launcher.planner.memory import RequestShape

T2V = "Wan-AI/Wan2.2-T2V-A14B-Diffusers"


def _printed_command(text: str) -> str:
    (line,) = [ln.strip() for ln in text.splitlines() if "vllm serve " in ln]
    return line


def test_the_printed_command_has_omni_right_after_the_model(capsys):
    assert main(["plan", "--model", T2V, "--gpu-memory", "80,80", "--host-ram", "256"]) == 0
    words = shlex.split(_printed_command(capsys.readouterr().out))
    serve = words.index("serve")
    assert words[serve + 1] == T2V and words[serve + 2] == "--omni"
    assert words[0] == "CUDA_VISIBLE_DEVICES=0,1"


def test_plan_json_flags_and_command_are_the_full_spec_flags(capsys):
    assert main(["plan", "--model", T2V, "--gpu-memory", "80,80", "--host-ram", "256", "--json"]) == 0
    rec = json.loads(capsys.readouterr().out)["recommendation"]
    assert rec["flags"][0] == "--omni"
    assert shlex.split(rec["command"])[1:] == ["vllm", "serve", T2V, *rec["flags"]]
    assert all(r["flags"][0] == "--omni" for r in rec["rejected"])


def test_the_printed_command_is_the_argv_that_argv_prints_for_the_same_plan(capsys, monkeypatch):
    """`argv --parallel auto` plans with the same planner; its argv is the recommended one plus what a launch
    adds (the address, the port) and its environment the same GPUs plus the (redacted) key."""
    monkeypatch.setenv(GPU_MEMORY_ENV, "80,80")
    assert main(["plan", "--model", T2V, "--gpu-memory", "80,80", "--json"]) == 0
    planned = json.loads(capsys.readouterr().out)["recommendation"]["command"]
    assert main(["argv", "--model", T2V, "--parallel", "auto", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    env = {k: v for k, v in shown["env"].items() if k != "VLLM_API_KEY"}
    argv = shown["argv"][:shown["argv"].index("--host")]
    assert " ".join(f"{k}={v}" for k, v in env.items()) + " " + shlex.join(argv) == planned


def test_recommendation_text_and_json_print_one_command():
    rec = recommend(T2V, RequestShape(832, 480, 81), [80.0, 80.0], host_available_gib=256.0)
    assert f"  {rec.command()}" in rec.text().splitlines()
    assert rec.to_dict()["command"] == rec.command() == rec.spec.serve_command(["vllm"]).shell()
