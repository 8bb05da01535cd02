"""`generate --prompt` alone: which model auto serves on this machine, and the reason it gives (issue 18)."""
from __future__ import annotations

from pathlib import Path

import pytest

from vllm_omni_launcher.planner.auto_model import pick_model
from vllm_omni_launcher.server.config.local_config import LocalConfig

T2V = "Wan-AI/Wan2.2-T2V-A14B-Diffusers"
TI2V = "Wan-AI/Wan2.2-TI2V-5B-Diffusers"


@pytest.fixture()
def hub(tmp_path, monkeypatch) -> Path:
    """An empty Hugging Face cache, as the server would see it."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    return tmp_path / "hub"


def _downloaded(hub: Path, model: str) -> None:
    (hub / ("models--" + model.replace("/", "--")) / "snapshots" / "abc123").mkdir(parents=True)


def test_without_gpu_sizes_it_serves_ti2v_and_says_why(hub):
    pick = pick_model(LocalConfig(), [], "no GPU information (NVML could not start)")
    assert pick.model == TI2V
    assert pick.why.startswith("no GPU information (NVML could not start), so nothing can be planned")


def test_on_two_80gb_gpus_with_nothing_downloaded_it_serves_the_smallest_download(hub):
    pick = pick_model(LocalConfig(), [80, 80], "GPUs from NVML")
    assert pick.model == TI2V
    assert "smallest download" in pick.why and f"--model {T2V}" in pick.why      # A14B fits too: say how


def test_a_downloaded_model_that_fits_wins(hub):
    _downloaded(hub, T2V)
    pick = pick_model(LocalConfig(), [80, 80], "GPUs from NVML")
    assert pick.model == T2V and pick.why.startswith("it is already downloaded and fits these GPUs (80 + 80 GiB)")


def test_a_downloaded_model_that_does_not_fit_is_not_picked(hub):
    _downloaded(hub, T2V)
    assert pick_model(LocalConfig(), [24], "GPUs from NVML").model == TI2V


def test_the_cache_the_server_is_given_counts(tmp_path, hub):
    other = tmp_path / "server-hub"
    _downloaded(other, T2V)
    config = LocalConfig(extra_env={"HF_HUB_CACHE": str(other)})      # the local config's extra_env wins
    assert pick_model(config, [80, 80], "GPUs from NVML").model == T2V


I2V = "Wan-AI/Wan2.2-I2V-A14B-Diffusers"


def test_with_a_start_image_a_downloaded_text_only_model_is_passed_over(hub):
    _downloaded(hub, T2V)                               # picked without an image; it would refuse --image
    assert pick_model(LocalConfig(), [80, 80], "GPUs from NVML").model == T2V
    pick = pick_model(LocalConfig(), [80, 80], "GPUs from NVML", start_image=True)
    assert pick.model == TI2V and f"--model {I2V}" in pick.why      # the image model that fits too: say how


def test_with_a_start_image_a_downloaded_image_model_that_fits_wins(hub):
    _downloaded(hub, I2V)
    pick = pick_model(LocalConfig(), [80, 80], "GPUs from NVML", start_image=True)
    assert pick.model == I2V and pick.why.startswith("it is already downloaded and fits these GPUs")
