"""Flags from blog posts get one text per case, true for the server version the spec is checked
against, and the README's table says the same; a flag is never read as the value of the flag
before it (`--cache-config --api-key=x` must not let --api-key through)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from vllm_omni_launcher.errors import SpecError
from vllm_omni_launcher.server.launch.flags import MISLEADING_FLAGS, NONEXISTENT_FLAGS, check_extra_flags

README = Path(__file__).resolve().parents[2] / "README.md"


def _error(flags: list[str], version=(0, 30)) -> SpecError:
    with pytest.raises(SpecError) as err:
        check_extra_flags(flags, version)
    return err.value


@pytest.mark.parametrize("version", [(0, 26), (0, 30)])
def test_num_gpus_is_one_text_that_says_it_is_ignored(version):
    assert str(_error(["--num-gpus", "2"], version)) == (
        "Flag --num-gpus does nothing in vLLM-Omni. Why: the real `vllm serve --omni` accepts it and ignores it: "
        "the server still runs on one GPU (world size 1). Fix: remove it; choose a parallel mode and degree instead "
        "(parallel mode ulysses with degree 2, or --parallel ulysses=2).")


def test_stage_configs_path_is_real_in_026_and_gone_in_030():
    assert str(_error(["--stage-configs-path=a.yaml"], (0, 26))) == (
        "Flag --stage-configs-path cannot be an extra flag. Why: vLLM-Omni 0.26 has it (deprecated), but it names a "
        "stage-config file, which a workflow must not choose, and the launcher configures the stages with CLI flags "
        "itself. Fix: remove it; set what the file would set with the launcher's settings (parallel mode, offload, "
        "VAE tiling).")
    assert str(_error(["--stage-configs-path=a.yaml"], (0, 30))) == (
        "Flag --stage-configs-path was removed in vLLM-Omni 0.30. Why: the server environment runs 0.30, whose "
        "parser exits with 'unrecognized arguments: --stage-configs-path'. Fix: remove it; the launcher configures "
        "the stages with CLI flags (its settings: parallel mode, offload, VAE tiling).")


def test_a_flag_that_does_not_exist_reads_as_one_sentence():
    assert str(_error(["--model-type", "wan2_2"])) == (
        "Flag --model-type does not exist in vLLM-Omni. Why: it comes from blog posts; the real `vllm serve --omni` "
        "(0.26 and 0.30) exits with 'unrecognized arguments: --model-type'. Fix: remove it; nothing replaces it: the "
        "pipeline comes from the model's model_index.json (to force one, add --model-class-name=WanPipeline or "
        "--model-class-name=WanImageToVideoPipeline).")
    for flag, fix in NONEXISTENT_FLAGS.items():
        text = str(_error([flag]))
        assert "accepted" not in text and "ignored" not in text and f"Fix: remove it; {fix}." in text


def test_the_readme_table_says_what_the_launcher_says():
    section = README.read_text().split("## Flags from blog posts that do not exist", 1)[1].split("\n## ", 1)[0]
    rows = {m.group(1).split()[0]: (m.group(2), m.group(3))
            for m in re.finditer(r"^\| `([^`]+)` \| (.+?) \| (.+?) \|$", section, re.M)}
    assert set(NONEXISTENT_FLAGS) | set(MISLEADING_FLAGS) <= set(rows)
    for flag in NONEXISTENT_FLAGS:
        assert rows[flag][0] == "`unrecognized arguments` (0.26 and 0.30)", flag
    assert rows["--num-gpus"][0] == "accepted, **ignored** (world size stays 1)"
    assert rows["--stage-configs-path"][0] == "real (deprecated) in 0.26; `unrecognized arguments` in 0.30"


@pytest.mark.parametrize("flags,after", [
    (["--cache-config", "--api-key=x"], "--api-key=x"),           # a local-only flag
    (["--cache-config", "-q", "fp8"], "-q"),                      # a launcher setting's short form
    (["--max-num-seqs", "--trust-remote-code"], "--trust-remote-code"),
])
def test_a_flag_is_never_read_as_the_value_of_the_flag_before_it(flags, after):
    err = _error(flags)
    assert err.what == f"Flag {flags[0]} needs a value"
    assert err.why == f"it is not a switch, and {after} after it is a flag, not its value"
    assert err.fix == f"write it as {flags[0]}=VALUE"


def test_a_value_in_the_next_token_is_still_taken():
    check_extra_flags(["--cache-config", '{"a": 1}', "--max-num-seqs", "1"], (0, 30))
    check_extra_flags(["--cache-config={}", "--enable-cache-dit-summary"], (0, 30))
