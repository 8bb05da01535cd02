"""Local Server, Remote Server, Stop Server and Server Status nodes.

Caching (ComfyUI folds every upstream IS_CHANGED into the downstream cache keys): Local
Server has no IS_CHANGED and Remote Server's is a stable string, so an unchanged graph
re-queued runs nothing, and a changed seed or prompt re-runs only Generate Video, which
finds (or starts again) the live server itself (session.py). Stop Server and Server
Status report the present, so they run every time they are queued (NaN); nothing
expensive is downstream of them.
"""
from __future__ import annotations

from typing import Optional

from ..models import FAMILIES
from . import session
from .handles import MODEL_TYPE, SERVER_TYPE, SERVING_TYPE, ModelChoice, ServerHandle, ServingChoice

CATEGORY = "vLLM-Omni"
SERVER_TOOLTIP = ("a server handle from Local Server or Remote Server: which server, never its key "
                  "(looked up on this machine at use)")


class LocalServer:
    """Start (or reuse) a vLLM-Omni server on this machine for the model and serving config."""

    DESCRIPTION = ("Starts vLLM-Omni on this machine's GPUs, or reuses the running one when nothing changed; "
                   "shows the plan, then download, load and warm-up progress. Cancel stops a launch within "
                   "seconds. The program, host and keys come from the local launcher config, never the "
                   "workflow. A server stopped later (keep-alive, Stop Server) is started again by Generate "
                   "Video when it needs it.")
    CATEGORY = CATEGORY
    RETURN_TYPES = (SERVER_TYPE,)
    RETURN_NAMES = ("server",)
    OUTPUT_TOOLTIPS = ("handle of this server (no secret): connect to Generate Video, Server Status or Stop Server",)
    FUNCTION = "start"

    @classmethod
    def INPUT_TYPES(cls):  # noqa: N802
        return {"required": {
                    "model": (MODEL_TYPE, {"tooltip": "the model from Load Wan2.2 Model"}),
                    "serving": (SERVING_TYPE, {"tooltip": "GPUs, parallelism and memory settings from Serving "
                                                          "Config"})},
                # PROMPT: the queued graph, whose Generate nodes' guidance (and batch size) the auto planner plans for
                "hidden": {"unique_id": "UNIQUE_ID", "prompt": "PROMPT"}}

    def start(self, model: ModelChoice, serving: ServingChoice, unique_id: Optional[str] = None,
              prompt: Optional[dict] = None):
        return (session.start_local(model, serving, unique_id, prompt),)


class RemoteServer:
    """Use a vLLM-Omni server started elsewhere (e.g. `python -m vllm_omni_launcher serve` on a GPU box)."""

    DESCRIPTION = ("Connects to an existing vLLM-Omni server: one this machine's launcher config names "
                   "(remote_servers), or a URL typed here. An API key is sent only to an origin the local "
                   "config names with that key, never to a URL a workflow chose; it never comes from a widget.")
    CATEGORY = CATEGORY
    RETURN_TYPES = (SERVER_TYPE,)
    RETURN_NAMES = ("server",)
    OUTPUT_TOOLTIPS = ("handle of the remote server (no secret): connect to Generate Video or Server Status",)
    FUNCTION = "connect"
    OWN_CHOICE_CHECKS = ("remote_server",)   # session names the config to add it to (input_checks.py)

    @classmethod
    def INPUT_TYPES(cls):  # noqa: N802
        return {"required": {
                    "url": ("STRING", {"default": "http://127.0.0.1:8091",
                                       "tooltip": "server base URL (no /v1); used when remote_server is "
                                                  f"'{session.USE_URL}'"}),
                    "model_family": ([f.key for f in FAMILIES.values()], {
                        "default": "ti2v_5b",
                        "tooltip": "which Wan2.2 model the server runs: t2v_a14b, i2v_a14b or ti2v_5b (for the "
                                   "size and frame rules and the recommended values)"})},
                "optional": {
                    "remote_server": (session.remote_choices(), {
                        "default": session.USE_URL,
                        "tooltip": "a server named in this machine's launcher config (remote_servers, with its "
                                   f"URL and key), or '{session.USE_URL}' for the url above"})},
                "hidden": {"unique_id": "UNIQUE_ID"}}

    @classmethod
    def IS_CHANGED(cls, url="", model_family="", remote_server=session.USE_URL, **_):  # noqa: N802
        # Stable for the same widgets and config: a constant key keeps Generate Video cached.
        return session.remote_identity(str(url or ""), str(remote_server or session.USE_URL))

    def connect(self, url: str, model_family: str, remote_server: str = session.USE_URL,
                unique_id: Optional[str] = None):
        return (session.connect_remote(url, model_family, remote_server, unique_id),)


class StopServer:
    """Stop launcher-started servers to free the GPUs (only processes this ComfyUI started)."""

    DESCRIPTION = ("Stops the connected local server, or every server this ComfyUI started (stop_all or no "
                   "server connected), and frees their GPUs. Runs every time it is queued; its report shows "
                   "on the node and in its report output.")
    CATEGORY = CATEGORY
    RETURN_TYPES = ("STRING",)
    RETURN_NAMES = ("report",)
    OUTPUT_TOOLTIPS = ("what was stopped (also shown on the node); wire it to Preview Any to keep it",)
    FUNCTION = "stop"
    OUTPUT_NODE = True

    @classmethod
    def INPUT_TYPES(cls):  # noqa: N802
        return {"required": {"stop_all": ("BOOLEAN", {"default": False,
                                                      "tooltip": "stop every server this ComfyUI started"})},
                "optional": {"server": (SERVER_TYPE, {"tooltip": "the server to stop (a remote one is never "
                                                                 "stopped); none connected = all"})},
                "hidden": {"unique_id": "UNIQUE_ID"}}

    @classmethod
    def IS_CHANGED(cls, **_):  # noqa: N802
        return float("nan")   # acts every time it is queued; nothing is downstream of it

    def stop(self, stop_all: bool, server: Optional[ServerHandle] = None, unique_id: Optional[str] = None):
        return session.stop_servers(server, stop_all, unique_id)


class ServerStatus:
    """Show what each launcher-started server is doing (phase, GPUs, URL, last error)."""

    DESCRIPTION = ("Phase, GPUs, URL and last error of the connected server, or of every server this ComfyUI "
                   "started. Runs every time it is queued; the report shows on the node and in its output.")
    CATEGORY = CATEGORY
    RETURN_TYPES = ("STRING",)
    RETURN_NAMES = ("status",)
    OUTPUT_TOOLTIPS = ("the status report (also shown on the node); wire it to Preview Any to keep it",)
    FUNCTION = "report"
    OUTPUT_NODE = True

    @classmethod
    def INPUT_TYPES(cls):  # noqa: N802
        return {"required": {},
                "optional": {"server": (SERVER_TYPE, {"tooltip": "the server to report on; none connected = every "
                                                                 "launcher-started server"})},
                "hidden": {"unique_id": "UNIQUE_ID"}}

    @classmethod
    def IS_CHANGED(cls, **_):  # noqa: N802
        return float("nan")   # reports the present every time; nothing is downstream of it

    def report(self, server: Optional[ServerHandle] = None, unique_id: Optional[str] = None):
        return session.server_report(server, unique_id)
