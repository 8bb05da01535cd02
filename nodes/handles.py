"""The small values that flow between the launcher's nodes.

ComfyUI caches node outputs and prints inputs in error messages, so these are plain,
serialisable descriptors: no process objects and no secrets. The live server stays in the
registry (server/registry.py); the API key is looked up at use, never carried.

A handle is what its node returns for the same inputs: it names *which* server (the launch
spec's fingerprint, or the remote URL / configured name), not which process. Generate Video
finds the live process by fingerprint when it runs, so a server restarted by the supervisor
(new port, new key) or stopped by keep-alive is used or started again without re-running,
and re-queueing an unchanged graph costs nothing.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ..client.request import RequestLora

from ..models import FAMILIES, WanFamily
# The serving choice and the plan's request limit are the core's (planner/launch_plan.py); they
# travel in handles, so the nodes import them from here.
from ..planner.launch_plan import RequestLimit, ServingChoice
from ..server.loras import LoraEntry

MODEL_TYPE = "VLLM_OMNI_MODEL"
SERVING_TYPE = "VLLM_OMNI_SERVING"
SERVER_TYPE = "VLLM_OMNI_SERVER"


@dataclass(frozen=True)
class ModelChoice:
    """Which Wan2.2 model: an HF id or a local Diffusers folder, and its family.

    `label` is the entry picked in Load Model (a preset id or `local/<relative path>`);
    `model` is what the server is started with (the preset id, or the folder's path here).
    `loras`: the LoRAs chained onto it by vLLM-Omni LoRA nodes, in order (server/loras.py
    decides whether each is fused at startup or sent per request).
    """

    model: str
    family_key: str
    label: str = ""
    loras: tuple[LoraEntry, ...] = ()

    @property
    def family(self) -> WanFamily:
        return FAMILIES[self.family_key]


@dataclass(frozen=True)
class ServerHandle:
    """Where to send jobs.

    local:  `server_id` is the fingerprint of the launch spec asked for; `model` and `serving`
            let Generate Video start it again when it is no longer running; `limit` is the
            plan's reduced default request, applied where Generate's widgets say 0; `lora`
            is the per-request LoRA of the model's chain (fused ones are in the server itself).
    remote: `remote_name` is the locally configured server's name ("" for a typed URL).
    """

    kind: str                          # "local" | "remote"
    url: str
    served_name: str
    family_key: str
    server_id: str = ""
    server_version: tuple[int, int] = (0, 30)
    model: Optional[ModelChoice] = None
    serving: Optional[ServingChoice] = None
    limit: Optional[RequestLimit] = None
    remote_name: str = ""
    lora: Optional[RequestLora] = None

    @property
    def family(self) -> WanFamily:
        return FAMILIES[self.family_key]

    def __repr__(self) -> str:  # no key exists here, but keep it short and obviously safe
        where = f" ({self.remote_name})" if self.remote_name else ""
        return f"ServerHandle({self.kind} {self.url}{where} model={self.served_name!r})"

    __str__ = __repr__


__all__ = ["MODEL_TYPE", "SERVING_TYPE", "SERVER_TYPE", "ModelChoice", "RequestLimit", "ServerHandle",
           "ServingChoice"]
