"""A small stand-in for the ComfyUI hooks our nodes use, installed in sys.modules.

It mirrors the real behaviour that matters (docs/upstream-facts.md, "ComfyUI progress and interrupt"): ProgressBar
updates check the interrupt flag and raise InterruptProcessingException;
`processing_interrupted()` only reads the flag; `throw_exception_if_processing_interrupted()`
clears and raises; PromptServer.instance.send_progress_text records the status text.
"""
from __future__ import annotations

import sys
import threading
import types
from typing import Any, Optional


class InterruptProcessingException(Exception):
    pass


class ComfyStandIn:
    """Installs fake `comfy.utils`, `comfy.model_management` and `server` modules."""

    def __init__(self) -> None:
        self.interrupt = threading.Event()
        self.progress: list[tuple[float, Optional[float]]] = []
        self.texts: list[tuple[str, Optional[str]]] = []
        self._saved: dict[str, Any] = {}

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

        utils = types.ModuleType("comfy.utils")

        class ProgressBar:
            def __init__(self, total: int, node_id: Optional[str] = None) -> None:
                self.total = total

            def update_absolute(self, value: float, total: Optional[float] = None, preview: Any = None) -> None:
                throw_exception_if_processing_interrupted()   # the real hook does this
                standin.progress.append((value, total))

        utils.ProgressBar = ProgressBar
        comfy = types.ModuleType("comfy")
        comfy.utils, comfy.model_management = utils, mm

        server = types.ModuleType("server")

        class PromptServer:
            instance: Any = None

            def send_progress_text(self, text: str, node_id: Optional[str]) -> None:
                standin.texts.append((text, node_id))

        PromptServer.instance = PromptServer()
        server.PromptServer = PromptServer
        return {"comfy": comfy, "comfy.utils": utils, "comfy.model_management": mm, "server": server}

    def __enter__(self) -> "ComfyStandIn":
        for name, module in self._modules().items():
            self._saved[name] = sys.modules.get(name)
            sys.modules[name] = module
        return self

    def __exit__(self, *exc: Any) -> None:
        for name, module in self._saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module
