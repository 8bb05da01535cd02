"""A small stand-in for the ComfyUI hooks our nodes use, installed in sys.modules, and ComfyUI's
way of calling a node (`run_node`).

It mirrors the real behaviour that matters (docs/upstream-facts.md, "ComfyUI progress and interrupt"):
the pinned V3 API's `ComfyAPI.Execution().set_progress(value, max_value, node_id=...)`, a coroutine
run on PromptServer.instance.loop (a loop in a thread of its own, as ComfyUI's server loop is to a
node), records the bar (it never raises: the real one only updates the progress state); `processing_interrupted()`
only reads the flag; `throw_exception_if_processing_interrupted()` clears and raises;
PromptServer.instance.send_progress_text records the status text. tests/comfyui runs the same
nodes in a real ComfyUI.
"""
from __future__ import annotations

import asyncio
import sys
import threading
import types
from typing import Any, Optional

from vllm_omni_launcher.nodes import NODES
from vllm_omni_launcher.nodes.comfy_bridge import PINNED


class InterruptProcessingException(Exception):
    pass


class ComfyStandIn:
    """Installs fake `comfy.model_management`, `server` and pinned `comfy_api` modules."""

    def __init__(self) -> None:
        self.interrupt = threading.Event()
        self.progress: list[tuple[float, Optional[float]]] = []
        self.texts: list[tuple[str, Optional[str]]] = []
        self._saved: dict[str, Any] = {}
        self.loop = asyncio.new_event_loop()

    # -- the fake modules ---------------------------------------------------------------
    def _modules(self) -> dict[str, types.ModuleType]:
        standin = self
        mm = types.ModuleType("comfy.model_management")
        mm.InterruptProcessingException = InterruptProcessingException
        mm.processing_interrupted = lambda: standin.interrupt.is_set()

        def throw_exception_if_processing_interrupted() -> None:
            if standin.interrupt.is_set():
                standin.interrupt.clear()
                raise InterruptProcessingException()

        mm.throw_exception_if_processing_interrupted = throw_exception_if_processing_interrupted

        comfy = types.ModuleType("comfy")
        comfy.model_management = mm

        class ComfyAPI:
            class Execution:
                async def set_progress(self, value: float, max_value: float, node_id: Optional[str] = None) -> None:
                    standin.progress.append((value, max_value))

        pinned = types.ModuleType(PINNED)
        pinned.ComfyAPI = ComfyAPI
        comfy_api = types.ModuleType("comfy_api")
        setattr(comfy_api, PINNED.rpartition(".")[2], pinned)

        server = types.ModuleType("server")

        class PromptServer:
            instance: Any = None

            loop = standin.loop

            def send_progress_text(self, text: str, node_id: Optional[str]) -> None:
                standin.texts.append((text, node_id))

        PromptServer.instance = PromptServer()
        server.PromptServer = PromptServer
        return {"comfy": comfy, "comfy.model_management": mm, "server": server, "comfy_api": comfy_api,
                PINNED: pinned}

    def __enter__(self) -> "ComfyStandIn":
        self._loop_thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._loop_thread.start()
        for name, module in self._modules().items():
            self._saved[name] = sys.modules.get(name)
            sys.modules[name] = module
        return self

    def __exit__(self, *exc: Any) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._loop_thread.join(timeout=10)
        self.loop.close()
        for name, module in self._saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module


def run_node(node_id: str, *args: Any, **values: Any) -> tuple:
    """Run our node `node_id` as ComfyUI's V3 execute does (nodes/v3.py: `Node.call`): `args` are its
    inputs in declaration order, `values` by name, its hidden inputs (unique_id, prompt) split off."""
    node = NODES[node_id]
    values.update(zip([i.name for i in node.inputs()], args))
    hidden = {name: values.pop(name) for name in node.hidden if name in values}
    return node.call(values, hidden)
