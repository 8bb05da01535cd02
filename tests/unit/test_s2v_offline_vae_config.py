"""An S2V server that would run offline without the Wan VAE config in its HF cache is refused before it starts.

vLLM-Omni 0.30 loads S2V's `Wan2.1_VAE.pth` with diffusers' `from_single_file`, which reads
`Wan-AI/Wan2.1-T2V-14B-Diffusers` `vae/config.json` through the HF cache; offline and uncached, the server dies
at load (tests/fixtures/logs/failures/vllm-omni-0.30-s2v-vae-single-file-offline.log: that call, run in the
server environment with HF_HUB_OFFLINE=1 and an empty cache). The launch, the doctor and the log classifier say
the same: what, why (with upstream's words), and the one-file download or unsetting offline mode.
tests/contract/test_s2v_vae_config_upstream.py checks the cache rule against the real loader.
"""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from fake_hf_cache import cache_file
from fake_nvml import broken_nvml
from vllm_omni_launcher.errors import failure_patterns as patterns
from vllm_omni_launcher.models import FAMILIES, PIPELINE_FAMILIES
from vllm_omni_launcher.planner.doctor import run_doctor
from vllm_omni_launcher.planner.doctor_report import OK, PROBLEM
from vllm_omni_launcher.server.config.local_config import LocalConfig
from vllm_omni_launcher.server.launch import hf_cache
from vllm_omni_launcher.server.launch.spec import LaunchSpec
from vllm_omni_launcher.server.logs import failures
from vllm_omni_launcher.server.logs.failures import Context, ServerFailure, classify
from vllm_omni_launcher.server.logs.log_follower import read_tail
from vllm_omni_launcher.server.process import launch_prep

S2V, S2V_ID = PIPELINE_FAMILIES["s2v_14b"], "Wan-AI/Wan2.2-S2V-14B"
REPO, FILE = "Wan-AI/Wan2.1-T2V-14B-Diffusers", "vae/config.json"
LOG = Path(__file__).resolve().parents[1] / "fixtures" / "logs" / "failures" / \
    "vllm-omni-0.30-s2v-vae-single-file-offline.log"
VAE_CONFIG = json.dumps({"_class_name": "AutoencoderKLWan", "z_dim": 16, "base_dim": 96}).encode()


@pytest.fixture
def offline(monkeypatch, tmp_path):
    """ComfyUI's environment: offline, its HF cache under tmp_path (empty)."""
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return tmp_path / "hf" / "hub"


def _prepare(tmp_path: Path, model: str = S2V_ID) -> launch_prep.Launch:
    data = tmp_path / "data"
    return launch_prep.prepare(LaunchSpec(model=model, gpus=(0,)), LocalConfig(data_dir=str(data)), ["vllm"],
                               str(data), True, None, lambda: False)


def test_an_offline_s2v_launch_without_the_cached_vae_config_is_refused_before_it_starts(offline, tmp_path):
    with pytest.raises(ServerFailure) as info:
        _prepare(tmp_path)
    err = info.value
    assert err.kind == failures.HF_CONFIG_MISSING and err.kind in failures.PERMANENT and err.setting == "extra_env"
    assert err.what == f"Wan2.2 S2V-14B cannot load its VAE: {REPO} {FILE} is not in the Hugging Face cache"
    assert f"diffusers' from_single_file, which reads the VAE's config from the Hub repo {REPO}" in err.why
    assert f"the Hugging Face cache at {offline}" in err.why and "HF_HUB_OFFLINE=1 is set for the server" in err.why
    assert f"upstream stops with: OSError: {REPO} does not appear to have a file named config.json." in err.why
    assert f"`hf download {REPO} {FILE} --cache-dir {offline}`" in err.fix
    assert "remove HF_HUB_OFFLINE and TRANSFORMERS_OFFLINE from the launcher config's extra_env" in err.fix
    assert not (tmp_path / "data" / "storage").exists() or not any((tmp_path / "data" / "storage").iterdir())


def test_the_same_launch_starts_when_the_hf_cache_holds_the_vae_config(offline, tmp_path):
    cache_file(offline, REPO, FILE, VAE_CONFIG)
    assert _prepare(tmp_path).env["HF_HUB_OFFLINE"] == "1"


def test_the_cache_is_read_as_huggingface_hub_reads_it(tmp_path):
    hub = tmp_path / "hub"
    env = {"HF_HUB_CACHE": str(hub)}
    entry = cache_file(hub, REPO, FILE, VAE_CONFIG)
    assert hf_cache.cached_file(REPO, FILE, env) == entry
    refs = hub / "models--Wan-AI--Wan2.1-T2V-14B-Diffusers" / "refs" / "main"
    refs.write_text("a" * 40 + "\n")                  # huggingface_hub reads refs as written: no such snapshot
    assert hf_cache.cached_file(REPO, FILE, env) is None
    refs.write_text("a" * 40)
    entry.resolve().unlink()                          # a snapshot link to a missing blob is no file
    assert hf_cache.cached_file(REPO, FILE, env) is None


@pytest.mark.parametrize("env,where", [
    ({"HF_HUB_CACHE": "/c/hub", "HUGGINGFACE_HUB_CACHE": "/old", "HF_HOME": "/h"}, "/c/hub"),
    ({"HUGGINGFACE_HUB_CACHE": "/old", "HF_HOME": "/h"}, "/old"),
    ({"HF_HOME": "/h", "XDG_CACHE_HOME": "/x"}, "/h/hub"),
    ({"XDG_CACHE_HOME": "/x"}, "/x/huggingface/hub"),
    ({"HF_HOME": "$BASE/hf", "BASE": "/b"}, "/b/hf/hub"),
])
def test_the_cache_folder_follows_huggingface_hubs_variables(env, where):
    assert hf_cache.hub_dir(env) == Path(where)


@pytest.mark.parametrize("env,offline", [
    ({"HF_HUB_OFFLINE": "1"}, "HF_HUB_OFFLINE=1"), ({"HF_HUB_OFFLINE": "true"}, "HF_HUB_OFFLINE=true"),
    ({"TRANSFORMERS_OFFLINE": "1"}, "TRANSFORMERS_OFFLINE=1"),
    ({"HF_HUB_OFFLINE": "0", "TRANSFORMERS_OFFLINE": "1"}, None),   # HF_HUB_OFFLINE set: TRANSFORMERS_ unread
    ({"HF_HUB_OFFLINE": "", "TRANSFORMERS_OFFLINE": "yes"}, "TRANSFORMERS_OFFLINE=yes"), ({}, None),
])
def test_offline_mode_is_read_as_huggingface_hub_reads_it(env, offline):
    assert hf_cache.offline_setting(env) == offline


def test_only_s2v_outside_the_diffusers_layout_needs_the_vae_config(tmp_path):
    env = {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "empty")}
    assert hf_cache.wan_vae_config_refusal(S2V_ID, S2V, env) is not None
    assert hf_cache.wan_vae_config_refusal(S2V_ID, S2V, {"HF_HUB_CACHE": str(tmp_path / "empty")}) is None
    for family in (*FAMILIES.values(), PIPELINE_FAMILIES["vace_14b"]):
        assert hf_cache.wan_vae_config_refusal(family.hf_id, family, env) is None
    diffusers = tmp_path / "s2v-diffusers"                # upstream's _is_diffusers_format: tokenizer/ and vae/
    for sub in ("tokenizer", "vae"):
        (diffusers / sub).mkdir(parents=True)
    assert hf_cache.wan_vae_config_refusal(str(diffusers), S2V, env) is None


def test_doctor_reports_the_missing_vae_config_for_an_offline_s2v_server(offline, tmp_path):
    config = LocalConfig(data_dir=str(tmp_path / "data"), extra_env={"HF_HUB_OFFLINE": "1"})
    check = run_doctor(S2V_ID, config=config, nvml=broken_nvml(), runner=_no_env_script).check("s2v_vae_config")
    refusal = hf_cache.wan_vae_config_refusal(S2V_ID, S2V, {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(offline)})
    assert check.status == PROBLEM and check.summary == f"{refusal.what}: {refusal.why}" and check.fix == refusal.fix
    entry = cache_file(offline, REPO, FILE, VAE_CONFIG)
    check = run_doctor(S2V_ID, config=config, nvml=broken_nvml(), runner=_no_env_script).check("s2v_vae_config")
    assert check.status == OK and str(entry) in check.summary


def test_doctor_names_the_download_for_a_later_offline_start_when_online(offline, tmp_path, monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE")
    config = LocalConfig(data_dir=str(tmp_path / "data"))
    check = run_doctor(S2V_ID, config=config, nvml=broken_nvml(), runner=_no_env_script).check("s2v_vae_config")
    assert check.status == OK and "the server fetches it from the Hub at load" in check.summary
    assert f"hf download {REPO} {FILE} --cache-dir {offline}" in check.summary


def test_the_real_upstream_failure_is_explained_with_the_same_advice():
    tail = read_tail(str(LOG), lines=200)
    assert f"OSError: {REPO} does not appear to have a file named config.json." in tail    # upstream's own line
    err = classify(tail, Context(model=S2V_ID, exit_code=1, log_path="/logs/s2v.log"))
    assert err.kind == failures.HF_CONFIG_MISSING and err.kind in failures.PERMANENT
    assert err.what == f"Wan2.2 S2V-14B cannot load its VAE: {REPO} {FILE} is not in the Hugging Face cache"
    assert f"upstream stops with: {patterns.WAN_VAE_CONFIG_LINE}" in err.why
    assert f"`hf download {REPO} {FILE}`" in err.fix and err.fix.endswith("the whole server log is /logs/s2v.log")
    assert "LocalEntryNotFoundError" in err.raw         # matched before the generic not-found rule


def _no_env_script(cmd, **kwargs):
    """The doctor's server-environment script is not what these tests check: it is not run."""
    return subprocess.CompletedProcess(cmd, 1, stdout="", stderr="not run by this test")
