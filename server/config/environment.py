"""The environment a launched server process gets: only what vLLM-Omni needs.

ComfyUI's own environment holds things the server must never see -- the launcher's remote
API keys (VLLM_OMNI_LAUNCHER_*, and any variable a remote server's `api_key_env` names, even
one with an allow-listed prefix), a VLLM_API_KEY meant for something else, ComfyUI's
PYTHONPATH (which would shadow the server venv's packages) and whatever else the user's
shell exports. So the child starts from an allow-list of the parent's variables (system
basics, CUDA / NVIDIA / NCCL / NVSHMEM (e.g. NVSHMEM_DISABLE_NVLS=1, which hosts without NVLink
multicast need), Hugging Face, torch / Triton caches, VLLM_* tuning), then the
operator's `extra_env` from the local config, then the compile cache (below), then the launch's
own variables (the spec's CUDA_VISIBLE_DEVICES and the fresh per-launch VLLM_API_KEY).

The compile cache. vLLM-Omni compiles the diffusion transformer's repeated blocks with plain
torch.compile (0.26 and 0.30 alike; vllm's own TORCHINDUCTOR_CACHE_DIR redirection in
vllm/compilation/ serves its LLM path only), so inductor's caches, and the Triton kernels under
them (`<cache>/triton/<device>`), go where TORCHINDUCTOR_CACHE_DIR says: by default
`<tempdir>/torchinductor_<user>`, lost at each reboot where /tmp is a tmpfs and aged out by
systemd-tmpfiles. The first server after a reboot then warms up cold (T2V-A14B on one H100:
18-19 s with compile, 30 s with FP8 + compile, 5 s when the cache held the blocks). So a server
we launch gets a private folder under the data dir (storage/compile_cache.py makes it and
refuses one others could write), unless the user's environment or `extra_env` names a cache:
theirs wins. A workflow never chooses it. TRITON_CACHE_DIR is left alone: inductor's kernels
follow the inductor cache, and Triton's own default (~/.triton/cache) already persists.
torch writes its default into its process's environment when anything imports torch._inductor
(ComfyUI does, loading its nodes), and inductor's Triton kernels set TRITON_CACHE_DIR to
`<default>/triton/<device>`: such values are torch's, not the user's, and do not reach the server.
"""
from __future__ import annotations

import getpass
import os
import re
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Optional

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


def is_inherited(name: str, key_variables: frozenset[str] = frozenset()) -> bool:
    """Whether the parent's variable `name` reaches the server. `key_variables`: the ones the local
    config reads remote servers' keys from (LocalConfig.key_variables), withheld whatever their
    prefix: an `api_key_env` may well be called VLLM_... or HF_..."""
    return (name not in key_variables and not is_reserved_name(name)
            and (name in INHERITED_NAMES or name.startswith(INHERITED_PREFIXES)))


INDUCTOR_CACHE = "TORCHINDUCTOR_CACHE_DIR"
TRITON_CACHE = "TRITON_CACHE_DIR"


def torch_default_cache_dir() -> str:
    """torch's default TORCHINDUCTOR_CACHE_DIR in this process (torch/_inductor/runtime/cache_dir_utils.py's rule)."""
    try:
        user = getpass.getuser()
    except (KeyError, ImportError, OSError):
        user = f"uid_{os.getuid()}" if hasattr(os, "getuid") else "unknown_user"
    return os.path.join(tempfile.gettempdir(), "torchinductor_" + re.sub(r'[\\/:*?"<>|]', "_", user))


def set_by_torch(name: str, value: str) -> bool:
    """Whether `name=value` is what torch itself wrote into this process's environment (see the module docstring)."""
    if name not in (INDUCTOR_CACHE, TRITON_CACHE) or not value:
        return False
    path, default = os.path.abspath(value), torch_default_cache_dir()
    return path == default if name == INDUCTOR_CACHE else os.path.dirname(path) == os.path.join(default, "triton")


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


def server_environment(parent: Mapping[str, str], config: LocalConfig, launch_env: Mapping[str, str],
                       compile_cache: Optional[Callable[[], Path]] = None) -> dict[str, str]:
    """The child's environment: allow-listed `parent` variables (minus the ones remote servers'
    keys come from, ComfyUI's allocator choice and torch's own cache defaults), then
    `config.extra_env` (the config refuses reserved names there), then the folder
    `compile_cache()` makes when neither named a compile cache (called only then: a user's own
    cache needs none of ours), then `launch_env`, each layer overriding the last."""
    withheld = config.key_variables()
    env = {name: value for name, value in parent.items()
           if is_inherited(name, withheld) and not set_by_torch(name, value)}
    for name in ALLOC_CONF_NAMES:
        if name in env:
            kept = without_comfyui_allocator(env[name])
            if kept:
                env[name] = kept
            else:
                del env[name]
    env.update(config.extra_env)
    if compile_cache is not None and not env.get(INDUCTOR_CACHE):
        env[INDUCTOR_CACHE] = str(compile_cache())
    env.update(launch_env)
    return env
