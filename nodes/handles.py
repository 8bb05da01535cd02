"""The small values that flow between the launcher's nodes.

ComfyUI caches node outputs and prints inputs in error messages, so these are plain,
serialisable descriptors: no process objects and no secrets. The live server stays in the
supervisor's module-level registry; the API key is looked up at use, never carried.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..models import FAMILIES, WanFamily

MODEL_TYPE = "VLLM_OMNI_MODEL"
SERVING_TYPE = "VLLM_OMNI_SERVING"
SERVER_TYPE = "VLLM_OMNI_SERVER"


@dataclass(frozen=True)
class ModelChoice:
    """Which Wan2.2 model: an HF id or a local Diffusers folder, and its family."""

    model: str
    family_key: str

    @property
    def family(self) -> WanFamily:
        return FAMILIES[self.family_key]


@dataclass(frozen=True)
class ServingChoice:
    """How to serve it: the serving-config node's widgets, before GPUs are resolved."""

    gpus: str = "auto"                 # auto | all | "0" | "0,1" | "count=2"
    parallel_mode: str = "auto"        # auto | none | ulysses | cfg | tensor | ring | hsdp
    parallel_degree: int = 2
    vae_patch_parallel: int = 1
    offload: str = "none"
    fp8: bool = False
    vae_tiling: bool = False
    cache_backend: str = "none"
    compile: bool = True
    keep_alive_minutes: float = 0.0
    auto_fallback: bool = True


@dataclass(frozen=True)
class ServerHandle:
    """Where to send jobs. `server_id` is the supervisor fingerprint for a local server."""

    kind: str                          # "local" | "remote"
    url: str
    served_name: str
    family_key: str
    server_id: str = ""
    generation: int = 0
    server_version: tuple[int, int] = (0, 30)

    @property
    def family(self) -> WanFamily:
        return FAMILIES[self.family_key]

    def __repr__(self) -> str:  # no key exists here, but keep it short and obviously safe
        return (f"ServerHandle({self.kind} {self.url} model={self.served_name!r} "
                f"gen={self.generation})")

    __str__ = __repr__
