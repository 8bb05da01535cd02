"""`plan` prints commands a user pastes into a shell: the replicas' `--stage-overrides` JSON
(quotes, braces, spaces) must come out quoted, so the pasted line is the argv the launcher runs."""
from __future__ import annotations

import json
import shlex

from vllm_omni_launcher.cli import main
from vllm_omni_launcher.planner.launch_plan import GPU_MEMORY_ENV, ServingChoice, resolve_launch
from vllm_omni_launcher.planner.memory import plan
from vllm_omni_launcher.server.config.local_config import LocalConfig
from vllm_omni_launcher.server.launch.spec import LaunchSpec

TI2V = "Wan-AI/Wan2.2-TI2V-5B-Diffusers"


def _command_line(text: str) -> str:
    (line,) = [ln.strip() for ln in text.splitlines() if "vllm serve " in ln]
    return line


def test_the_recommended_replica_command_pastes_into_a_shell_as_its_argv(monkeypatch):
    monkeypatch.setenv(GPU_MEMORY_ENV, "80,80")
    config = LocalConfig()
    choice = ServingChoice(replicas=2)
    rec = resolve_launch(choice.base_spec(TI2V, config), config, gpus=choice.gpus, auto=True,
                         server_version=(0, 30))
    assert "--stage-overrides" in rec.spec.flags()
    words = shlex.split(_command_line(rec.text))
    assert words[0] == "CUDA_VISIBLE_DEVICES=0,1"
    assert words[1:] == ["vllm", "serve", TI2V, *rec.spec.flags()] and words[4] == "--omni"


def test_the_plan_command_prints_quoted_stage_overrides(capsys):
    rc = main(["plan", "--model", TI2V, "--gpu-memory", "80,80", "--replicas", "2", "--host-ram", "256"])
    out = capsys.readouterr().out
    assert rc == 0
    line = _command_line(out)
    value = shlex.split(line)[shlex.split(line).index("--stage-overrides") + 1]
    assert json.loads(value) == {"0": {"num_replicas": 2, "devices": "0,1"}}     # one word, the JSON intact
    flags_line = next(ln for ln in out.splitlines() if ln.startswith("flags: "))
    words = shlex.split(flags_line[len("flags: "):])
    assert words[words.index("--stage-overrides") + 1] == value


def test_a_memory_plans_flags_line_is_shell_words():
    spec = LaunchSpec(model=TI2V, gpus=(0, 1), replicas=2)
    line = next(ln for ln in plan(spec, None, [80.0, 80.0]).text().splitlines() if ln.startswith("flags: "))
    assert shlex.split(line[len("flags: "):]) == spec.flags() and spec.flags()[0] == "--omni"   # all of them
