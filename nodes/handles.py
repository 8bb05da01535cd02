"""The small values that flow between the launcher's nodes.

ComfyUI caches outputs and prints inputs in errors, so these are plain descriptors, no process, no
secret: a handle names *which* server (the spec's fingerprint, or the remote URL / configured name), and
Generate Video finds the live one when it runs (restarted, or stopped by keep-alive: started again).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ..client.request import RequestLora
from ..models import ALL_FAMILIES, WanFamily
# The serving choice and the plan's request limit are the core's (planner/launch_plan.py); they
# travel in handles, so the nodes import them from here.
from ..planner.launch_plan import RequestLimit, ServingChoice
from ..server.launch.loras import LoraEntry

MODEL_TYPE = "VLLM_OMNI_MODEL"
SERVING_TYPE = "VLLM_OMNI_SERVING"
SERVER_TYPE = "VLLM_OMNI_SERVER"


@dataclass(frozen=True)
class ModelChoice:
    """Which Wan2.2 model: `model` what the server starts with (a preset id or a folder's path),
    `label` the Load Model entry, `loras` the chain of LoRA nodes in order (server/launch/loras.py
    decides whether each is fused at startup or sent per request)."""

    model: str
    family_key: str
    label: str = ""
    loras: tuple[LoraEntry, ...] = ()

    @property
    def family(self) -> WanFamily:
        return ALL_FAMILIES[self.family_key]


@dataclass(frozen=True)
class ServerHandle:
    """Where to send jobs. Local: `server_id` the launch spec's fingerprint; `model` and `serving`
    to start it again; `limit` the plan's reduced request (where Generate's widgets say 0); `lora` the
    chain's per-request LoRA (fused ones are in the server). Remote: `remote_name` the configured name
    ("" for a typed URL)."""

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
        return ALL_FAMILIES[self.family_key]

    def __repr__(self) -> str:  # no key exists here, but keep it short and obviously safe
        where = f" ({self.remote_name})" if self.remote_name else ""
        return f"ServerHandle({self.kind} {self.url}{where} model={self.served_name!r})"


__all__ = ["MODEL_TYPE", "SERVING_TYPE", "SERVER_TYPE", "ModelChoice", "RequestLimit", "ServerHandle",
           "ServingChoice"]
