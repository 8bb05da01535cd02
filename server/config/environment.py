"""The environment a launched server process gets: only what vLLM-Omni needs.

ComfyUI's own environment holds things the server must never see -- the launcher's remote
API keys (VLLM_OMNI_LAUNCHER_*), a VLLM_API_KEY meant for something else, ComfyUI's
PYTHONPATH (which would shadow the server venv's packages) and whatever else the user's
shell exports. So the child starts from an allow-list of the parent's variables (system
basics, CUDA / NVIDIA / NCCL / NVSHMEM (e.g. NVSHMEM_DISABLE_NVLS=1, which hosts without NVLink
multicast need), Hugging Face, torch / Triton caches, VLLM_* tuning), then the
operator's `extra_env` from the local config, then the launch's own variables (the spec's
CUDA_VISIBLE_DEVICES and the fresh per-launch VLLM_API_KEY).
"""
from __future__ import annotations

from collections.abc import Mapping

from ...errors.config_names import is_reserved_name
from .local_config import LocalConfig

# Parent variables passed by exact name.
INHERITED_NAMES = frozenset({
    "PATH", "HOME", "USER", "LOGNAME", "SHELL", "TERM", "LANG", "LANGUAGE", "TZ",
    "TMPDIR", "TMP", "TEMP",
    "LD_LIBRARY_PATH", "LIBRARY_PATH", "CC", "CXX",            # Triton / inductor compile kernels
    "HUGGING_FACE_HUB_TOKEN",                                   # old name of HF_TOKEN
    "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY",       # model downloads behind a proxy
    "http_proxy", "https_proxy", "no_proxy", "all_proxy",
    "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE",
    "OMP_NUM_THREADS", "MKL_NUM_THREADS",
    "DIFFUSION_ATTENTION_BACKEND",                              # vLLM-Omni's fallback for the flag
})
# Parent variables passed by prefix (VLLM_ minus the reserved names below).
INHERITED_PREFIXES = (
    "LC_", "XDG_",
    "CUDA_", "NVIDIA_", "NCCL_", "NVSHMEM_", "CUBLAS_", "CUDNN_", "GLOO_", "HIP_", "ROCM_", "ROCR_",
    "HF_", "HUGGINGFACE_", "TRANSFORMERS_", "DIFFUSERS_",
    "TORCH_", "TORCHINDUCTOR_", "PYTORCH_", "TRITON_",
    "VLLM_",
)


def is_inherited(name: str) -> bool:
    """Whether the parent's variable `name` reaches the server."""
    return not is_reserved_name(name) and (name in INHERITED_NAMES or name.startswith(INHERITED_PREFIXES))


# ComfyUI's cuda_malloc.py switches its own process to torch's cudaMallocAsync backend by
# appending `backend:cudaMallocAsync` to PYTORCH_CUDA_ALLOC_CONF. That choice is ComfyUI's, not
# the user's, and vLLM's memory profiling and pool allocator expect torch's native caching
# allocator, so the entry is dropped on the way to the server (the user's other options stay;
# an operator who wants it for the server sets it in extra_env).
ALLOC_CONF_NAMES = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")
COMFYUI_ALLOC_BACKEND = "backend:cudamallocasync"


def without_comfyui_allocator(value: str) -> str:
    """`value` (a torch allocator config: comma-separated options) without the async backend entry."""
    return ",".join(p for p in value.split(",") if p.strip() and p.strip().lower() != COMFYUI_ALLOC_BACKEND)


def server_environment(parent: Mapping[str, str], config: LocalConfig,
                       launch_env: Mapping[str, str]) -> dict[str, str]:
    """The child's environment: allow-listed `parent` variables (minus ComfyUI's allocator
    choice), then `config.extra_env` (the config refuses reserved names there), then
    `launch_env`, each layer overriding the last."""
    env = {name: value for name, value in parent.items() if is_inherited(name)}
    for name in ALLOC_CONF_NAMES:
        if name in env:
            kept = without_comfyui_allocator(env[name])
            if kept:
                env[name] = kept
            else:
                del env[name]
    env.update(config.extra_env)
    env.update(launch_env)
    return env
