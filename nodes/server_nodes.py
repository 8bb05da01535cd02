"""Local Server, Remote Server, Stop Server, Server Status and Doctor nodes.

Caching (ComfyUI folds every upstream fingerprint_inputs into the downstream cache keys): Local
Server has none and Remote Server's is a stable string, so an unchanged graph re-queued runs
nothing, and a changed seed or prompt re-runs only Generate Video, which finds (or starts
again) the live server itself (session.py). Stop Server, Server Status and Doctor report the
present, so they run every time they are queued (NaN never equals itself); nothing expensive
is downstream of them.
"""
from __future__ import annotations

from typing import Any, Callable

from ..models import ALL_FAMILIES
from ..server.config.local_config import load_local_config
from ..server.config.remote_servers import USE_URL, remote_choices, remote_identity
from . import session
from .handles import MODEL_TYPE, SERVER_TYPE, SERVING_TYPE
from .schema import Input, Node, Output


def _report_node(node_id: str, name: str, description: str, inputs: Callable[[], list[Input]], output: str,
                 what: str, run: Callable[..., tuple]) -> Node:
    """A report node (see above): runs on every queue (NaN), its text on the node and as its STRING output."""
    return Node(node_id, name, description, inputs, (Output("STRING", output, f"{what} (also shown on the node); "
                "wire it to Preview Any to keep it"),), run, output_node=True, shows_text=True,
                fingerprint=lambda **_: float("nan"))


def _remote_identity(url: Any = "", remote_server: Any = USE_URL, **_: Any) -> str:
    # Stable for the same widgets and config: a constant key keeps Generate Video cached.
    return remote_identity(load_local_config, str(url or ""), str(remote_server or USE_URL))


LOCAL_SERVER = Node(
    "VLLMOmniLocalServer", "vLLM-Omni Local Server",
    "Starts vLLM-Omni on this machine's GPUs, or reuses the running one when nothing changed; shows the plan, "
    "then download, load and warm-up progress. Cancel stops a launch within seconds. The program, host and keys "
    "come from the local launcher config, never the workflow. A server stopped later (keep-alive, Stop Server) "
    "is started again by Generate Video when it needs it.",
    lambda: [Input("model", MODEL_TYPE, "the model from Load Wan2.2 Model"),
             Input("serving", SERVING_TYPE, "GPUs, parallelism and memory settings from Serving Config")],
    (Output(SERVER_TYPE, "server", "handle of this server (no secret): connect to Generate Video, Server Status "
            "or Stop Server"),),
    # PROMPT: the queued graph, whose Generate nodes' guidance (and batch size) the auto planner plans for
    lambda model, serving, unique_id, prompt: (session.start_local(model, serving, unique_id, prompt),),
    hidden=("unique_id", "prompt"))

REMOTE_SERVER = Node(
    "VLLMOmniRemoteServer", "vLLM-Omni Remote Server",
    "Connects to an existing vLLM-Omni server: one this machine's launcher config names (remote_servers), or a "
    "URL typed here. An API key is sent only to an origin the local config names with that key, never to a URL "
    "a workflow chose; it never comes from a widget.",
    lambda: [
        Input("url", "STRING", f"server base URL (no /v1); used when remote_server is '{USE_URL}'",
              default="http://127.0.0.1:8091"),
        Input("model_family", "COMBO", "which Wan2.2 model the server runs: t2v_a14b, i2v_a14b or ti2v_5b, or a "
              "VACE / S2V / FastWan one (for the size and frame rules and the recommended values)",
              default="ti2v_5b", options=tuple(ALL_FAMILIES)),
        Input("remote_server", "COMBO", "a server named in this machine's launcher config (remote_servers, with "
              f"its URL and key), or '{USE_URL}' for the url above", default=USE_URL, optional=True,
              own_choice=True, options=lambda: remote_choices(load_local_config)),  # the run names what to fix
    ],
    (Output(SERVER_TYPE, "server", "handle of the remote server (no secret): connect to Generate Video or Server "
            "Status"),),
    lambda url, model_family, remote_server, unique_id: (
        session.connect_remote(url, model_family, remote_server, unique_id),),
    fingerprint=_remote_identity)

STOP_SERVER = _report_node(
    "VLLMOmniStopServer", "vLLM-Omni Stop Server",
    "Stops the connected local server, or every server this ComfyUI started (stop_all or no server connected), "
    "and frees their GPUs. Runs every time it is queued; its report shows on the node and in its report output.",
    lambda: [Input("stop_all", "BOOLEAN", "stop every server this ComfyUI started", default=False),
             Input("server", SERVER_TYPE, "the server to stop (a remote one is never stopped); none connected = "
                   "all", optional=True)],
    "report", "what was stopped", lambda stop_all, server, unique_id: session.stop_servers(server, stop_all, unique_id))

SERVER_STATUS = _report_node(
    "VLLMOmniServerStatus", "vLLM-Omni Server Status",
    "Phase, GPUs, URL and last error of the connected server, or of every server this ComfyUI started. Runs "
    "every time it is queued; the report shows on the node and in its output.",
    lambda: [Input("server", SERVER_TYPE, "the server to report on; none connected = every launcher-started "
                   "server", optional=True)],
    "status", "the status report", lambda server, unique_id: session.server_report(server, unique_id))

DOCTOR = _report_node(
    "VLLMOmniDoctor", "vLLM-Omni Doctor",
    "Checks this machine for vLLM-Omni: GPUs and peer-to-peer access, memory ComfyUI holds, the server "
    "environment's vllm / vllm-omni pair, disk, the model folder, the Diffusers folders Load Model leaves out and "
    "the port; each problem with its fix. The report starts with the verdict (problems and warnings by name, and "
    "whether this is a GPU box or a client-only one), so it reads at the node's default size. Runs every time it "
    "is queued; the report shows on the node and in its output.",
    lambda: [Input("model", MODEL_TYPE, "also check this model: its size against the disk and the GPUs, its local "
                   "folder", optional=True)],
    "report", "the doctor report", lambda model, unique_id: session.doctor_report(model, unique_id))
