"""Where no exact configuration fits, the answer names the FP8 configuration that would (planned by the same
ladder with FP8 allowed, with its GPU and host RAM figures and the switch that allows it), or says that even
FP8 does not fit and why; FP8 itself stays off unless asked. `plan`, `serve` and the Local Server node (its
Serving Config resolved) show the same sentence: the recommendation owns it."""
from __future__ import annotations

from types import SimpleNamespace

import psutil
import pytest

import stubserver
from vllm_omni_launcher.cli import main
from vllm_omni_launcher.errors import LauncherError
from vllm_omni_launcher.nodes.handles import ServingChoice
from vllm_omni_launcher.planner.ladder import FP8_SKIPPED, recommend
from vllm_omni_launcher.planner.launch_plan import GPU_MEMORY_ENV
from vllm_omni_launcher.planner.memory import RequestShape
from vllm_omni_launcher.server.config.local_config import LocalConfig

T2V = "Wan-AI/Wan2.2-T2V-A14B-Diffusers"
ASKED = RequestShape(832, 480, 81)          # the model's default request, as the node and serve plan it


def _nothing_fits(gpu: float, host: float):
    rec = recommend(T2V, ASKED, [gpu], host_available_gib=host, speed="exact")
    assert rec.spec is None, "exact keeps FP8 off: nothing is recommended"
    return rec


def test_a_48gb_card_with_64gb_ram_is_told_which_fp8_configuration_fits_and_its_figures():
    rec = _nothing_fits(48, 64)
    fp8 = recommend(T2V, ASKED, [48], host_available_gib=64, allow_fp8=True)
    assert fp8.spec is not None and fp8.spec.memory.quantization == "fp8" and not fp8.reduced
    peak, host = fp8.plan.gpus[0].peak_gib, fp8.plan.host_ram["needed_gib"]
    assert rec.fp8_fits
    assert rec.way_out.startswith("With FP8 allowed (Serving Config's fp8 on, with parallel_mode auto; CLI: "
                                  "plan --allow-fp8, or serve / generate --quantization fp8 with --parallel auto), ")
    assert (f"{fp8.label} fits: {peak:.1f} GiB of 48.0 on GPU 0, {host:.0f} GiB host RAM of 64. FP8 changes the "
            "frames (they are not bf16's) and upstream has not validated Wan2.2 quantization") in rec.way_out
    text = rec.text()
    assert text.splitlines()[:2] == [f"No configuration fits: {rec.reason}", f"  {rec.way_out}"]
    assert FP8_SKIPPED not in rec.notes and "last resort" not in text, "the generic FP8 note gives way to the sentence"
    assert rec.to_dict()["way_out"] == rec.way_out


def test_where_fp8_fits_only_fewer_frames_the_sentence_says_which_request():
    rec = _nothing_fits(48, 30)
    assert " fits at 832x480x77 (not 832x480x81): " in rec.way_out and "on GPU 0." in rec.way_out


def test_where_even_fp8_does_not_fit_the_answer_says_so_and_what_limits_it():
    rec = _nothing_fits(16, 20)
    assert not rec.fp8_fits
    assert rec.way_out == ("Even FP8 does not fit: its leanest configuration (1 GPU + layerwise offload + VAE tiling "
                           "+ FP8) does not: host RAM needs 40 GiB, 20 available")


def test_with_fp8_already_tried_nothing_fitting_says_even_fp8_does_not_fit():
    for kwargs in ({"allow_fp8": True}, {"speed": "fast"}):
        rec = recommend(T2V, ASKED, [16], host_available_gib=20, **kwargs)
        assert rec.spec is None and rec.way_out.startswith("Even FP8 does not fit: its leanest configuration (")


def test_a_fitting_answer_keeps_the_generic_fp8_note_and_has_no_way_out():
    rec = recommend(T2V, ASKED, [48], host_available_gib=200, speed="exact")
    assert rec.spec is not None and rec.spec.memory.quantization == "none"
    assert rec.way_out == "" and FP8_SKIPPED in rec.notes


@pytest.fixture
def a_48gb_card_and_64gb_ram(server_env_python: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """The launcher checks the server environment's pair: the stub's (0.30). The GPU through the
    launcher's own override; this host's RAM as the user's machine has it (64 GiB)."""
    monkeypatch.setenv(GPU_MEMORY_ENV, "48")
    monkeypatch.setattr(psutil, "virtual_memory", lambda: SimpleNamespace(available=64 * 2**30))
    return _nothing_fits(48, 64).way_out


def test_the_node_serve_and_plan_show_the_same_sentence(a_48gb_card_and_64gb_ram, server_env_python, monkeypatch,
                                                        capsys):
    sentence = a_48gb_card_and_64gb_ram
    config = LocalConfig(server_command=(server_env_python, stubserver.STUB_SCRIPT))
    with pytest.raises(LauncherError) as node:          # what Local Server's launch resolves (session.launch_local)
        ServingChoice().resolve(T2V, config)
    assert node.value.what == "No serving configuration fits these GPUs" and node.value.setting == "serving"
    assert node.value.fix.startswith(f"{sentence}. Otherwise use a smaller model (TI2V-5B)")

    monkeypatch.setenv("VLLM_OMNI_LAUNCHER_SERVER_CMD", f"{server_env_python} {stubserver.STUB_SCRIPT}")
    assert main(["serve", "--model", T2V, "--parallel", "auto"]) != 0
    assert f"Fix: {sentence}. Otherwise use" in capsys.readouterr().err

    assert main(["plan", "--model", T2V, "--gpu-memory", "48", "--host-ram", "64"]) != 0
    assert f"\n  {sentence}\n" in capsys.readouterr().out


def test_where_even_fp8_does_not_fit_the_node_says_so_under_why_and_the_fix_is_what_to_change(server_env_python,
                                                                                             monkeypatch):
    monkeypatch.setenv(GPU_MEMORY_ENV, "16")
    monkeypatch.setattr(psutil, "virtual_memory", lambda: SimpleNamespace(available=20 * 2**30))
    config = LocalConfig(server_command=(server_env_python, stubserver.STUB_SCRIPT))
    with pytest.raises(LauncherError) as node:
        ServingChoice().resolve(T2V, config)
    way_out = _nothing_fits(16, 20).way_out
    assert node.value.why.endswith(f". {way_out}")              # more of the why, not a fix
    assert node.value.why.startswith("host RAM is the limit: ") and ("free host RAM (close other programs or "
                                                                     "servers); `plan --host-ram GB` plans for a "
                                                                     "machine with more") in node.value.why
    assert node.value.fix == "use a smaller model (TI2V-5B), fewer frames or a smaller size, or more GPUs"
    detail = str(node.value).split("\n", 1)[1]
    assert detail.startswith("--- the memory plan ---\nNo configuration fits: "), "the planner's words, not upstream's"


def test_a_ti2v_that_fits_nowhere_is_not_told_to_use_ti2v(server_env_python, monkeypatch):
    monkeypatch.setenv(GPU_MEMORY_ENV, "4")
    monkeypatch.setattr(psutil, "virtual_memory", lambda: SimpleNamespace(available=4 * 2**30))
    config = LocalConfig(server_command=(server_env_python, stubserver.STUB_SCRIPT))
    with pytest.raises(LauncherError) as node:
        ServingChoice().resolve("Wan-AI/Wan2.2-TI2V-5B-Diffusers", config)
    assert node.value.what == "No serving configuration fits these GPUs"
    assert node.value.fix.endswith("use fewer frames or a smaller size, or more GPUs") and "TI2V-5B)" not in node.value.fix
