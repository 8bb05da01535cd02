"""The server's environment: an allow-list of ComfyUI's, then the operator's extra_env, then the launch's."""
from __future__ import annotations

from vllm_omni_launcher.server.config.environment import is_inherited, server_environment
from vllm_omni_launcher.server.config.local_config import LocalConfig

PARENT = {
    "PATH": "/usr/bin", "HOME": "/home/u", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8",
    "CUDA_HOME": "/usr/local/cuda", "CUDA_VISIBLE_DEVICES": "0,1,2", "NCCL_P2P_DISABLE": "1",
    "HF_HOME": "/data/hf", "HF_TOKEN": "hf_abc", "HUGGING_FACE_HUB_TOKEN": "hf_old",
    "TORCHINDUCTOR_CACHE_DIR": "/tmp/ind", "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
    "TRITON_CACHE_DIR": "/tmp/tri", "VLLM_LOGGING_LEVEL": "DEBUG",
    "VLLM_API_KEY": "parent-key", "VLLM_OMNI_LAUNCHER_REMOTE_API_KEY": "remote-key",
    "VLLM_OMNI_LAUNCHER_REMOTE_URL": "http://gpu-box:8091", "VLLM_OMNI_LAUNCHER_CONFIG": "/x.json",
    "PYTHONPATH": "/comfy", "AWS_SECRET_ACCESS_KEY": "aws", "OPENAI_API_KEY": "sk-x", "COMFY_SOMETHING": "1",
}


def test_parent_allow_list_keeps_what_the_server_needs() -> None:
    env = server_environment(PARENT, LocalConfig(), {})
    for name in ("PATH", "HOME", "LANG", "LC_ALL", "CUDA_HOME", "NCCL_P2P_DISABLE", "HF_HOME", "HF_TOKEN",
                 "HUGGING_FACE_HUB_TOKEN", "TORCHINDUCTOR_CACHE_DIR", "PYTORCH_CUDA_ALLOC_CONF", "TRITON_CACHE_DIR",
                 "VLLM_LOGGING_LEVEL"):
        assert env[name] == PARENT[name]


def test_nvshmem_settings_reach_the_server_like_nccls() -> None:
    """NVSHMEM_DISABLE_NVLS=1 (hosts without NVLink multicast) reaches the server from ComfyUI's own
    environment, without extra_env, as NCCL_* does."""
    parent = {**PARENT, "NVSHMEM_DISABLE_NVLS": "1", "NVSHMEM_BOOTSTRAP": "UID"}
    env = server_environment(parent, LocalConfig(), {})
    assert (env["NVSHMEM_DISABLE_NVLS"], env["NVSHMEM_BOOTSTRAP"], env["NCCL_P2P_DISABLE"]) == ("1", "UID", "1")
    assert is_inherited("NVSHMEM_DISABLE_NVLS") and not is_inherited("NVSHMEMX_OTHER")


def test_launcher_keys_and_parent_api_key_never_reach_the_server() -> None:
    env = server_environment(PARENT, LocalConfig(), {})
    assert not [name for name in env if name.startswith("VLLM_OMNI_LAUNCHER_")]
    for name in ("VLLM_API_KEY", "PYTHONPATH", "AWS_SECRET_ACCESS_KEY", "OPENAI_API_KEY", "COMFY_SOMETHING"):
        assert name not in env
    assert "remote-key" not in env.values() and "parent-key" not in env.values()


def test_extra_env_then_launch_env_override_in_order() -> None:
    config = LocalConfig(extra_env={"HF_HOME": "/fast/hf", "CUSTOM_FLAG": "1", "CUDA_VISIBLE_DEVICES": "5"})
    env = server_environment(PARENT, config, {"CUDA_VISIBLE_DEVICES": "0,1", "VLLM_API_KEY": "launch-key"})
    assert env["HF_HOME"] == "/fast/hf" and env["CUSTOM_FLAG"] == "1"      # extra_env is not allow-listed
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1" and env["VLLM_API_KEY"] == "launch-key"


def test_without_a_launch_key_there_is_no_api_key_at_all() -> None:
    assert "VLLM_API_KEY" not in server_environment(PARENT, LocalConfig(), {"CUDA_VISIBLE_DEVICES": "0"})


def test_reserved_names_are_refused_case_insensitively() -> None:
    assert not is_inherited("vllm_omni_launcher_remote_api_key") and not is_inherited("Vllm_Api_Key")
    assert is_inherited("VLLM_OMNI_STUB_STEP_S") and not is_inherited("PYTHONPATH")


def test_comfyuis_async_allocator_choice_does_not_reach_the_server() -> None:
    # ComfyUI's cuda_malloc.py appends this to its own process's allocator config; the server keeps
    # torch's native allocator, and the user's own options.
    alone = server_environment({"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"}, LocalConfig(), {})
    assert "PYTORCH_CUDA_ALLOC_CONF" not in alone
    appended = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True,backend:cudaMallocAsync"}
    assert server_environment(appended, LocalConfig(), {})["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    wanted = LocalConfig(extra_env={"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"})
    assert server_environment(appended, wanted, {})["PYTORCH_CUDA_ALLOC_CONF"] == "backend:cudaMallocAsync"
