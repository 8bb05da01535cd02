"""The command line checks what a user typed before anything is planned or started, with one rule
for `generate` and `plan`, in the command line's own words: the exact message a user sees."""
from __future__ import annotations

import pytest

from vllm_omni_launcher.cli import COMMANDS, build_parser, main
from vllm_omni_launcher.planner.launch_plan import GPU_MEMORY_ENV

TI2V = "Wan-AI/Wan2.2-TI2V-5B-Diffusers"
I2V = "Wan-AI/Wan2.2-I2V-A14B-Diffusers"
T2V = "Wan-AI/Wan2.2-T2V-A14B-Diffusers"
IDS = (f"{T2V}, {I2V}, {TI2V}, Wan-AI/Wan2.1-VACE-14B-diffusers, Wan-AI/Wan2.1-VACE-1.3B-diffusers, "
       "Wan-AI/Wan2.2-S2V-14B, FastVideo/FastWan2.2-TI2V-5B-FullAttn-Diffusers")


@pytest.fixture(autouse=True)
def _a_gpu_machine_without_a_server(monkeypatch, tmp_path):
    """A GPU machine (the checks come before the GPU check matters) whose server program cannot be found:
    a check that passed would end in "Cannot find the vLLM-Omni server program", never in a launch."""
    monkeypatch.setenv(GPU_MEMORY_ENV, "80")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    for name in ("SERVER_CMD", "SERVER_ENV"):
        monkeypatch.delenv(f"VLLM_OMNI_LAUNCHER_{name}", raising=False)
    monkeypatch.chdir(tmp_path)


def _err(capsys, argv: list[str], code: int = 1) -> str:
    assert main(argv) == code
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    return captured.err


GENERATE, PLAN = ["generate", "--prompt", "a fox"], ["plan", "--model", TI2V]


@pytest.mark.parametrize("command,option,value,what,example", [
    (GENERATE, "--frames", "-3", "the frame count (4k+1) and must be at least 1", "81"),
    (PLAN, "--frames", "-3", "the frame count (4k+1) and must be at least 1", "81"),
    (GENERATE, "--width", "-32", "the frame width in pixels and must be at least 1", "1280"),
    (PLAN, "--width", "-32", "the frame width in pixels and must be at least 1", "1280"),
    (GENERATE, "--width", "0", "the frame width in pixels and must be at least 1", "1280"),
    (PLAN, "--height", "0", "the frame height in pixels and must be at least 1", "704"),
    (GENERATE, "--steps", "-1", "the number of denoise steps and must be at least 1", "40"),   # plan has no --steps
    # the upper bounds too come from the one declaration (client/request_fields.py)
    (GENERATE, "--steps", "500", "the number of denoise steps and must be at most 200", "40"),
    (GENERATE, "--guidance", "80", "the guidance scale and must be at most 20", "5"),
    (GENERATE, "--guidance-2", "20.5", "the low-noise expert's guidance scale and must be at most 20", "3"),
    (GENERATE, "--fps", "0.5", "frames per second and must be at least 1", "24"),
    (PLAN, "--frames", "2001", "the frame count (4k+1) and must be at most 1025", "81"),
    (PLAN, "--boundary-ratio", "2", "the A14B expert boundary and must be at most 1", "0.875"),
])
def test_a_value_outside_the_declared_range_is_one_error_in_generate_and_plan(capsys, command, option, value, what,
                                                                           example):
    assert _err(capsys, [*command, option, value]) == (
        f"error: {option} {value} is not valid. Why: it is {what}; on the command line a value is used as given (the "
        f"node's 0 / -1 markers do not apply). Fix: write e.g. {option} {example}, or leave {option} out for the "
        "model's recommended value.\n")


def test_a_seed_outside_the_nodes_range_names_the_option(capsys):
    """Not "the model's value" when left out, and no markers: a seed left out is drawn at random."""
    for value, bound in (("-1", "at least 0"), (str(2**63), f"at most {2**63 - 1}")):
        assert _err(capsys, [*GENERATE, "--seed", value]) == (f"error: --seed {value} is not valid. Why: it is the "
                                                              f"noise seed and must be {bound}. Fix: write e.g. --seed "
                                                              "42, or leave --seed out for a random one.\n")


def test_a_missing_image_names_the_option(capsys):
    assert _err(capsys, ["generate", "--prompt", "a fox", "--model", TI2V, "--image", "/missing.png"]) == (
        "error: --image /missing.png: no such file. Why: the start image must be a PNG or JPEG file. Fix: check the "
        "path given to --image.\n")


def test_with_url_and_family_an_image_the_model_does_not_take_is_refused_by_its_rule_before_reading(capsys):
    """--family says the model at once: its inputs rule refuses --image before the file is opened (the path
    does not exist) and before the server (nothing listens on port 9) is asked anything."""
    err = _err(capsys, [*GENERATE, "--url", "http://127.0.0.1:9", "--family", "t2v_a14b", "--image", "/missing.png"])
    assert err.startswith("error: Wan2.2 T2V-A14B does not take --image. ") and "no such file" not in err


def test_an_unreadable_image_names_the_option(capsys, tmp_path):
    bad = tmp_path / "notes.png"
    bad.write_text("not an image")
    err = _err(capsys, ["generate", "--prompt", "a fox", "--model", TI2V, "--image", str(bad)])
    assert err.startswith(f"error: --image {bad} cannot be read as an image. Why: ")
    assert err.endswith("Fix: give --image a PNG or JPEG file.\n")


def test_i2v_without_an_image_speaks_of_the_option(capsys):
    assert _err(capsys, ["generate", "--prompt", "a fox", "--model", I2V]) == (
        "error: Wan2.2 I2V-A14B needs a start image. Why: it is an image-to-video model; upstream fails the job with "
        "'No image is provided'. Fix: pass --image PATH (a "
        f"PNG or JPEG), or use --model {T2V} or {TI2V} for text-only video.\n")


def test_an_unknown_model_lists_the_ids_and_the_near_match(capsys):
    assert _err(capsys, ["generate", "--prompt", "a fox", "--model", "Wan-AI/Wan2.2-T2V-A14B"]) == (
        "error: Unknown model 'Wan-AI/Wan2.2-T2V-A14B'. Why: the launcher supports the Wan2.2 Diffusers repos, the "
        f"VACE, S2V and FastWan repos (docs/wan-pipelines.md) or a local folder holding one of them. Fix: did you mean {T2V}? use one of {IDS}, or the path of a local "
        "Wan2.2 *-Diffusers folder (it must contain model_index.json).\n")


def test_a_local_path_that_does_not_exist_says_so(capsys, tmp_path):
    missing = tmp_path / "models" / "wan"
    assert _err(capsys, ["plan", "--model", str(missing)]) == (
        f"error: Unknown model '{missing}'. Why: there is no folder at {missing}. Fix: use one of {IDS}, or the path "
        "of a local Wan2.2 *-Diffusers folder (it must contain model_index.json).\n")


def test_an_option_typo_prints_the_error_first_with_a_did_you_mean(capsys):
    prog = "python -m vllm_omni_launcher generate"
    assert _err(capsys, ["generate", "--promt", "a fox"], code=2) == (
        "error: unrecognized arguments: --promt\n"
        "  did you mean --prompt?\n"
        f"usage: {prog} [options] (`{prog} --help` lists them)\n")


def test_a_command_typo_gets_a_did_you_mean(capsys):
    err = _err(capsys, ["generte", "--prompt", "a fox"], code=2)
    assert err.splitlines()[1:] == ["  did you mean generate?",
                                    "usage: python -m vllm_omni_launcher COMMAND [options] "
                                    "(`python -m vllm_omni_launcher --help` lists them)"]


def test_an_extra_flag_in_the_space_form_says_to_join_it_with_equals(capsys):
    prog = "python -m vllm_omni_launcher argv"
    assert _err(capsys, ["argv", "--model", TI2V, "--extra-flag", "--max-num-seqs=1"], code=2) == (
        "error: argument --extra-flag: expected one argument\n"
        "  a value that starts with '-' must be joined to --extra-flag with '=': write --extra-flag=--max-num-seqs=1\n"
        f"usage: {prog} [options] (`{prog} --help` lists them)\n")


def test_help_lists_setup_first():
    assert list(COMMANDS)[:2] == ["setup", "doctor"]
    text = build_parser().format_help()
    assert text.index("    setup") < text.index("    doctor") < text.index("    generate")
