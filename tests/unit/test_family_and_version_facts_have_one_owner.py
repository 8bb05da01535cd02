"""Each model-family fact is declared once, on its WanFamily (models/families.py), and each version fact
once, in server/launch/versions.py: the planner, the request rules, auto model and the doctor read them
from there, so changing the declaration changes what they do, and their texts name the launcher's own
settings, not upstream's flags or sources."""
from __future__ import annotations

import dataclasses
import importlib
import json
import subprocess
import types

import numpy as np
import pytest

from pipeline_media import portrait, refused
from vllm_omni_launcher.client import media
from vllm_omni_launcher.models import ALL_FAMILIES, FAMILIES, PIPELINE_FAMILIES, request_for
from vllm_omni_launcher.planner import calibration
from vllm_omni_launcher.planner.auto_model import pick_model
from vllm_omni_launcher.planner.doctor_env import PINS, check_server_env
from vllm_omni_launcher.planner.doctor_report import PROBLEM, WARNING
from vllm_omni_launcher.planner.memory import plan
from vllm_omni_launcher.planner.model_sizes import builtin_sizes
from vllm_omni_launcher.server.config.local_config import LocalConfig
from vllm_omni_launcher.server.launch import versions
from vllm_omni_launcher.server.launch.spec import LaunchSpec


# ----------------------------------------------------------------------------- family facts
@pytest.mark.parametrize("key", sorted(ALL_FAMILIES))
def test_the_built_in_dit_shape_is_the_one_the_family_declares(key):
    family = ALL_FAMILIES[key]
    dit = builtin_sizes(family).dit
    assert (dit.layers, dit.heads, dit.head_dim, dit.ffn_dim, dit.in_channels, dit.vace_blocks) == (
        family.layers, family.attention_heads, family.head_dim, family.ffn_dim, family.dit_in_channels,
        family.vace_blocks)


def test_a_changed_family_declaration_changes_the_planner_sizes():
    family = dataclasses.replace(FAMILIES["t2v_a14b"], layers=20, attention_heads=20, ffn_dim=1000)
    dit = builtin_sizes(family).dit
    assert (dit.layers, dit.heads, dit.ffn_dim) == (20, 20, 1000)


def test_the_released_repos_keep_their_transformer_shapes():
    """The repos' transformer configs (docs/wan-pipelines.md): what the planner was calibrated with."""
    shapes = {key: (f.layers, f.attention_heads, f.head_dim, f.ffn_dim, f.dit_in_channels, f.vace_blocks)
              for key, f in ALL_FAMILIES.items()}
    assert shapes == {"t2v_a14b": (40, 40, 128, 13824, 16, 0), "i2v_a14b": (40, 40, 128, 13824, 36, 0),
                      "ti2v_5b": (30, 24, 128, 14336, 48, 0), "vace_14b": (40, 40, 128, 13824, 16, 8),
                      "vace_1_3b": (30, 12, 128, 8960, 16, 15), "s2v_14b": (40, 40, 128, 13824, 16, 0),
                      "fastwan_ti2v_5b": (30, 24, 128, 14336, 48, 0)}


@pytest.mark.parametrize("key", sorted(ALL_FAMILIES))
def test_the_per_token_modulation_is_planned_exactly_for_expand_timesteps_families(key):
    family = ALL_FAMILIES[key]
    terms = {t.name for t in plan(LaunchSpec(model=family.hf_id), gpus=[80.0], host_available_gib=None).gpus[0].terms}
    assert ("per-token timestep modulation" in terms) is family.expand_timesteps
    assert family.expand_timesteps is (key in ("ti2v_5b", "fastwan_ti2v_5b"))   # TI2V-5B's DiT


def test_s2v_takes_its_fps_from_the_family():
    s2v = PIPELINE_FAMILIES["s2v_14b"]
    audio = media.audio_clip(np.zeros((2, 32000), np.float32), 16000)     # 2 s of silence
    assert request_for(s2v, prompt="x", image=portrait(), audio=audio).fps == s2v.fps == 16.0
    other = dataclasses.replace(s2v, fps=25.0)
    assert request_for(other, prompt="x", fps=25, image=portrait(), audio=audio).fps == 25.0
    err = refused(lambda: request_for(other, prompt="x", fps=16, image=portrait(), audio=audio))
    assert err.setting == "fps" and "set fps to 25" in err.fix and "25 frames a second" in err.why


def test_auto_model_states_the_download_sizes_the_families_declare(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    why = pick_model(LocalConfig(), [], "no GPU information").why
    assert f"about {FAMILIES['ti2v_5b'].download_gb} GB to download" in why
    why = pick_model(LocalConfig(), [80, 80], "GPUs from NVML").why
    assert f"T2V-A14B is about {FAMILIES['t2v_a14b'].download_gb} GB" in why
    assert (FAMILIES["t2v_a14b"].download_gb, FAMILIES["ti2v_5b"].download_gb) == (65, 23)   # as the README says


# ----------------------------------------------------------------------------- texts users see
def _all_plan_texts() -> list[str]:
    """What plans explain (their notes and each term's note), without the `vllm serve` flags they show."""
    texts = []
    for family in ALL_FAMILIES.values():
        base = LaunchSpec(model=family.hf_id)
        for spec in (base, dataclasses.replace(base, memory=dataclasses.replace(base.memory, vae_slicing=True)),
                     dataclasses.replace(base, parallel=dataclasses.replace(base.parallel, mode="ulysses", degree=2,
                                                                             vae_patch=2, ulysses_mode="advanced_uaa"))):
            made = plan(spec, gpus=[80.0, 80.0], host_available_gib=None)
            texts += made.notes + [t.note for g in made.gpus for t in g.terms]
    return texts


def test_plans_name_the_launchers_settings_not_upstreams_flags_or_sources():
    texts = "\n".join(_all_plan_texts())
    for upstream in ("--vae-use-tiling", "--vae-use-slicing", "registry.py"):
        assert upstream not in texts
    assert "Serving Config's vae_tiling, CLI --vae-tiling" in texts
    assert "VAE slicing (--vae-slicing) splits only a batch" in texts
    assert "VAE patch parallel (Serving Config's vae_patch_parallel, CLI --vae-patch) turns VAE tiling on" in texts


def test_the_tile_overlap_follows_the_tile_size_and_stride():
    cal = calibration.CALIBRATION
    assert cal["tile_overlap"] == (calibration.TILE_PX / calibration.TILE_STRIDE_PX) ** 2 == (256 / 192) ** 2


# ----------------------------------------------------------------------------- the planner package
def test_planner_model_sizes_and_step_down_are_the_modules():
    planner = importlib.import_module("vllm_omni_launcher.planner")
    assert isinstance(planner.model_sizes, types.ModuleType)
    assert isinstance(planner.step_down, types.ModuleType)
    assert callable(planner.model_sizes.model_sizes) and callable(planner.step_down.step_down)


# ----------------------------------------------------------------------------- version facts
def test_the_pinned_release_is_the_default_line():
    assert versions.PINNED_RELEASE == "%d.%d.0" % versions.DEFAULT_VERSION
    assert versions.DEFAULT_VERSION in versions.SUPPORTED


def test_the_doctor_knows_the_pins_of_exactly_the_supported_lines():
    assert set(PINS) == set(versions.SUPPORTED)


def _env(tmp_path, vllm, omni):
    env = tmp_path / "env"
    (env / "bin").mkdir(parents=True)
    (env / "bin" / "python").write_text("")
    found = {"python": "3.12.3", "vllm": vllm, "vllm-omni": omni, "torch": "2.13.0", "diffusers": "0.40.0"}

    def runner(cmd, **_kw):
        return subprocess.CompletedProcess(cmd, 0, stdout="DOCTOR_JSON " + json.dumps(found), stderr="")
    return check_server_env(LocalConfig(server_env=str(env), data_dir=str(tmp_path)), runner, 10.0)[0][0]


def test_the_doctor_names_the_pinned_release_and_the_supported_lines(tmp_path, monkeypatch):
    monkeypatch.setattr("vllm_omni_launcher.planner.doctor_env.PINNED_RELEASE", "9.9.0")
    check = _env(tmp_path, None, "0.30.0")
    assert check.status == PROBLEM and "pip install vllm==9.9.0 vllm-omni==9.9.0" in check.fix
    check = _env(tmp_path / "b", "0.12.0", "0.12.0")
    assert check.status == WARNING and f"({versions.supported_lines()})" in check.summary
    assert "use vllm-omni 9.9.0 with vllm 9.9.0" in check.fix


def test_the_refusal_of_an_unknown_line_names_the_pinned_release():
    err = refused(versions.ServerVersions("3.12", "0.12.0", "0.12.0").check)
    assert f"it pins {versions.PINNED_RELEASE}" in err.fix and versions.supported_lines() in err.why
