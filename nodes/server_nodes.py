"""Local server, Remote server, Stop server and Server status nodes."""
from __future__ import annotations

from typing import Optional

from ..errors import LauncherError
from ..models import FAMILIES
from ..server import supervisor
from ..server.local_config import load_local_config
from . import comfy_bridge
from .handles import MODEL_TYPE, SERVER_TYPE, SERVING_TYPE, ModelChoice, ServerHandle, ServingChoice
from .serving import resolve_spec

CATEGORY = "vLLM-Omni"


def registry_token() -> str:
    """Changes whenever any supervised server starts, restarts or dies (IS_CHANGED key)."""
    return ";".join(f"{s.status().fingerprint}:{s.generation}:{int(s.alive())}"
                    for s in supervisor.all_servers())


def handle_for(sup: "supervisor.Supervisor") -> ServerHandle:
    status = sup.status()
    return ServerHandle("local", sup.url, sup.spec.served_name, sup.spec.family.key,
                        server_id=status.fingerprint, generation=sup.generation,
                        server_version=sup.server_version)


class LocalServer:
    """Start (or reuse) a vLLM-Omni server on this machine for the model and serving config."""

    DESCRIPTION = ("Starts vLLM-Omni on this machine's GPUs, or reuses the running one when nothing changed. "
                   "The program, host and keys come from the local launcher config, never the workflow.")
    CATEGORY = CATEGORY
    RETURN_TYPES = (SERVER_TYPE,)
    RETURN_NAMES = ("server",)
    FUNCTION = "start"

    @classmethod
    def INPUT_TYPES(cls):  # noqa: N802
        return {"required": {"model": (MODEL_TYPE,), "serving": (SERVING_TYPE,)},
                "hidden": {"unique_id": "UNIQUE_ID"}}

    @classmethod
    def IS_CHANGED(cls, **_):  # noqa: N802
        return registry_token()

    def start(self, model: ModelChoice, serving: ServingChoice, unique_id: Optional[str] = None):
        config = load_local_config()
        spec, plan_text, fallback = resolve_spec(model, serving, config)
        if plan_text:
            comfy_bridge.send_status(plan_text, unique_id)

        def on_status(status) -> None:
            comfy_bridge.send_status(status.text, unique_id)

        sup = supervisor.get_or_start(spec, config, fallback=fallback, on_status=on_status,
                                      keep_alive_minutes=serving.keep_alive_minutes)
        status = sup.status()
        comfy_bridge.send_status(status.text + (f"\n{status.fallback_note}" if status.fallback_note else ""),
                                 unique_id)
        return (handle_for(sup),)


class RemoteServer:
    """Use a vLLM-Omni server started elsewhere (e.g. `python -m vllm_omni_launcher serve` on a GPU box)."""

    DESCRIPTION = ("Connects to an existing vLLM-Omni server. The API key is read from the local launcher "
                   "config or VLLM_OMNI_LAUNCHER_REMOTE_API_KEY, never from a widget.")
    CATEGORY = CATEGORY
    RETURN_TYPES = (SERVER_TYPE,)
    RETURN_NAMES = ("server",)
    FUNCTION = "connect"

    @classmethod
    def INPUT_TYPES(cls):  # noqa: N802
        return {"required": {
            "url": ("STRING", {"default": "http://127.0.0.1:8091", "tooltip": "server base URL (no /v1)"}),
            "model_family": ([f.key for f in FAMILIES.values()], {"default": "ti2v_5b",
                             "tooltip": "which Wan2.2 model the server runs (for size/frame rules and defaults)"}),
        }}

    @classmethod
    def IS_CHANGED(cls, url, model_family):  # noqa: N802
        return float("nan")  # re-check the remote server on every run

    def connect(self, url: str, model_family: str):
        from ..client.api import VideoClient

        url = url.strip().rstrip("/")
        if url.endswith("/v1"):
            url = url[:-3]
        if not url.startswith(("http://", "https://")):
            raise LauncherError(f"Server URL '{url}' is not an http(s) URL", "the client needs a base URL",
                                "write it like http://127.0.0.1:8091", setting="url")
        client = VideoClient(url, api_key=load_local_config().api_key_for(url))
        names = client.models()
        if not names:
            raise LauncherError(f"The server at {url} serves no model", "/v1/models returned an empty list",
                                "check the server's log", setting="url")
        return (ServerHandle("remote", url, names[0], model_family),)


class StopServer:
    """Stop launcher-started servers to free the GPUs (only processes this ComfyUI started)."""

    CATEGORY = CATEGORY
    RETURN_TYPES = ("STRING",)
    RETURN_NAMES = ("report",)
    FUNCTION = "stop"
    OUTPUT_NODE = True

    @classmethod
    def INPUT_TYPES(cls):  # noqa: N802
        return {"required": {"stop_all": ("BOOLEAN", {"default": False,
                                                      "tooltip": "stop every server this ComfyUI started"})},
                "optional": {"server": (SERVER_TYPE,)}}

    @classmethod
    def IS_CHANGED(cls, **_):  # noqa: N802
        return float("nan")

    def stop(self, stop_all: bool, server: Optional[ServerHandle] = None):
        if server is not None and server.kind == "remote" and not stop_all:
            report = f"{server.url} is a remote server; the launcher only stops servers it started."
        elif stop_all or server is None:
            count = len(supervisor.all_servers())
            supervisor.stop_all()
            report = f"Stopped {count} server(s)."
        else:
            found = supervisor.find(server.server_id) is not None
            supervisor.stop(server.server_id)
            report = f"Stopped the server at {server.url}." if found else f"No running server at {server.url}."
        return {"ui": {"text": [report]}, "result": (report,)}


class ServerStatus:
    """Show what each launcher-started server is doing (phase, GPUs, URL, last error)."""

    CATEGORY = CATEGORY
    RETURN_TYPES = ("STRING",)
    RETURN_NAMES = ("status",)
    FUNCTION = "report"
    OUTPUT_NODE = True

    @classmethod
    def INPUT_TYPES(cls):  # noqa: N802
        return {"required": {}, "optional": {"server": (SERVER_TYPE,)}}

    @classmethod
    def IS_CHANGED(cls, **_):  # noqa: N802
        return float("nan")

    def report(self, server: Optional[ServerHandle] = None):
        servers = supervisor.all_servers()
        if server is not None and server.kind == "local":
            servers = [s for s in servers if s.status().fingerprint == server.server_id]
        lines = []
        for sup in servers:
            st = sup.status()
            gpus = ",".join(map(str, sup.spec.gpus)) if sup.spec.gpus is not None else "all visible"
            line = f"{sup.spec.served_name} on GPUs {gpus} at {st.url}: {st.text}"
            if st.last_error:
                line += f"\n  last error: {st.last_error}"
            lines.append(line)
        if server is not None and server.kind == "remote":
            lines.append(f"{server.served_name} at {server.url} (remote; not supervised here)")
        report = "\n".join(lines) or "No launcher-started server is running."
        return {"ui": {"text": [report]}, "result": (report,)}
