"""`serve` and `generate --model` check the server environment's vllm / vllm-omni pair before
anything starts, with the same function the Local Server node uses."""
from __future__ import annotations

import pytest

from fake_server_envs import fake_server_env, server_command
from vllm_omni_launcher.cli import main
from vllm_omni_launcher.server.launch import versions
from vllm_omni_launcher.server.config.local_config import load_local_config

TI2V = "Wan-AI/Wan2.2-TI2V-5B-Diffusers"


@pytest.fixture()
def config_env(tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_OMNI_LAUNCHER_CONFIG", str(tmp_path / "none.json"))
    monkeypatch.setenv("VLLM_OMNI_LAUNCHER_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("VLLM_OMNI_LAUNCHER_GPU_MEMORY_GB", "24")   # a GPU machine (this one may have none)

    def use(command: str) -> None:
        monkeypatch.setenv("VLLM_OMNI_LAUNCHER_SERVER_CMD", command)
    return use


@pytest.mark.parametrize("argv", [
    ["serve", "--model", TI2V, "--gpus", "0"],
    ["generate", "--model", TI2V, "--gpus", "0", "--prompt", "a fox"],
])
def test_a_mismatched_pair_is_refused_before_anything_starts(tmp_path, config_env, capsys, argv):
    root = fake_server_env(tmp_path, "0.26.0", "0.30.0")
    config_env(server_command(root))
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "vLLM 0.26.0 and vLLM-Omni 0.30.0 do not match" in err and "python -m vllm_omni_launcher setup" in err
    assert not (root / "started").exists()


def test_generate_with_only_a_prompt_names_its_model_then_refuses_the_pair(tmp_path, config_env, capsys,
                                                                           monkeypatch):
    monkeypatch.setenv("VLLM_OMNI_LAUNCHER_GPU_MEMORY_GB", "24")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    root = fake_server_env(tmp_path, "0.26.0", "0.30.0")
    config_env(server_command(root))
    monkeypatch.chdir(tmp_path)
    assert main(["generate", "--prompt", "a fox"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"model: {TI2V} (auto: ") and "vLLM 0.26.0 and vLLM-Omni 0.30.0 do not match" in err
    assert not (root / "started").exists() and not list(tmp_path.glob("*.mp4"))


def test_a_missing_vllm_omni_is_refused(tmp_path, config_env, capsys):
    root = fake_server_env(tmp_path, "0.30.0", None)
    config_env(server_command(root))
    assert main(["serve", "--model", TI2V, "--gpus", "0"]) == 1
    assert "has no vllm-omni" in capsys.readouterr().err and not (root / "started").exists()


def test_the_checked_version_decides_which_extra_flags_are_allowed(tmp_path, config_env, capsys):
    root = fake_server_env(tmp_path, "0.26.0", "0.26.0")
    config_env(server_command(root))
    assert versions.checked_server_version(load_local_config()) == (0, 26)
    assert main(["serve", "--model", TI2V, "--gpus", "0", "--extra-flag=--vae-fast-path=lossless"]) == 1
    assert "needs vLLM-Omni 0.30 or newer" in capsys.readouterr().err and not (root / "started").exists()


def test_an_unlocatable_interpreter_assumes_the_pinned_line(tmp_path, config_env):
    wrapper = tmp_path / "wrapper"                 # a binary-like program: no python, no shebang
    wrapper.write_bytes(b"\x7fELF")
    config_env(str(wrapper))
    assert versions.checked_server_version(load_local_config()) == versions.DEFAULT_VERSION
