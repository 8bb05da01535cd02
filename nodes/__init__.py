"""ComfyUI nodes (V1 API): a thin layer over server/, client/ and planner/.

Node ids carry the `VLLMOmni` prefix and never change: workflows store them.
"""
from ..server import registry
from .batch_node import GenerateBatch
from .doctor_node import Doctor
from .generate_node import GenerateVideo
from .input_checks import guard
from .lora_nodes import LoraModel
from .model_nodes import LoadModel, ServingConfig
from .server_nodes import LocalServer, RemoteServer, ServerStatus, StopServer

_NODES = {
    "VLLMOmniLoadModel": (LoadModel, "vLLM-Omni Load Wan2.2 Model"),
    "VLLMOmniServingConfig": (ServingConfig, "vLLM-Omni Serving Config"),
    "VLLMOmniLora": (LoraModel, "vLLM-Omni LoRA"),
    "VLLMOmniLocalServer": (LocalServer, "vLLM-Omni Local Server"),
    "VLLMOmniRemoteServer": (RemoteServer, "vLLM-Omni Remote Server"),
    "VLLMOmniGenerateVideo": (GenerateVideo, "vLLM-Omni Generate Video"),
    "VLLMOmniGenerateBatch": (GenerateBatch, "vLLM-Omni Generate Batch"),
    "VLLMOmniStopServer": (StopServer, "vLLM-Omni Stop Server"),
    "VLLMOmniServerStatus": (ServerStatus, "vLLM-Omni Server Status"),
    "VLLMOmniDoctor": (Doctor, "vLLM-Omni Doctor"),
}

# Each node's function checks its inputs against its own INPUT_TYPES first (input_checks.py).
NODE_CLASS_MAPPINGS = {node_id: guard(cls, name) for node_id, (cls, name) in _NODES.items()}
NODE_DISPLAY_NAME_MAPPINGS = {node_id: name for node_id, (_, name) in _NODES.items()}

# ComfyUI has no shutdown hook for custom nodes: stop our servers on exit and on SIGTERM/SIGINT
# (chained to ComfyUI's own handlers). Signal handlers need the main thread, where ComfyUI imports us.
registry.install_exit_handlers()
