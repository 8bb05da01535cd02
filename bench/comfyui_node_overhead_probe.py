"""The probe bench/comfyui_node_overhead.py installs as a custom node in a throwaway ComfyUI base (never this
pack): a V3 node that returns a preallocated IMAGE (and a VIDEO over BytesIO, and an fps) at once, and marks
with time.monotonic (one clock with the websocket reader's) where ComfyUI 0.3.64's executor spends its time
around every node: execution.execute, get_input_data, _async_map_node_over_list (the node's call),
get_output_from_returns, the output cache's set, the progress registry, ExecutionList's staging, and every
send_sync. GET /overhead_probe/marks returns the marks and clears them.

Loaded by ComfyUI only (it imports execution, server, comfy_api); no pack code imports it.
"""
from __future__ import annotations

import functools
import inspect
import io
import os
import time

MARKS: list[tuple[str, object, float]] = []
_TENSORS: dict[tuple, "torch.Tensor"] = {}
_VIDEOS: dict[int, bytes] = {}


def mark(tag: str, node: object = None) -> None:
    MARKS.append((tag, node, time.monotonic()))


def _wrap(owner: object, name: str, node_of) -> None:
    """Mark the enter and exit of owner.name (a function or method, sync or async)."""
    original = getattr(owner, name)

    if inspect.iscoroutinefunction(original):
        @functools.wraps(original)
        async def timed(*args, **kwargs):
            node = node_of(args, kwargs)
            mark(f"{name}>", node)
            try:
                return await original(*args, **kwargs)
            finally:
                mark(f"{name}<", node)
    else:
        @functools.wraps(original)
        def timed(*args, **kwargs):
            node = node_of(args, kwargs)
            mark(f"{name}>", node)
            try:
                return original(*args, **kwargs)
            finally:
                mark(f"{name}<", node)
    setattr(owner, name, timed)


BRIDGE = ("set_progress", "send_status", "make_video", "to_image", "interrupted")
CLIENT = ("submit", "generate")
_BRIDGED: list[str] = []


def _bridge_wrapped(node: object) -> object:
    """On the first node run (the pack is loaded by then): mark our pack's ComfyUI calls
    (nodes/comfy_bridge.py), the parts of our node that do nothing outside ComfyUI."""
    if not _BRIDGED:
        import sys

        for name, module in list(sys.modules.items()):
            if name.endswith(".nodes.comfy_bridge") and hasattr(module, "set_progress"):
                for function in BRIDGE:
                    _wrap(module, function, lambda a, k: None)
                _BRIDGED.append(name)
            if name.endswith(".client.api") and hasattr(module, "VideoClient"):
                for method in CLIENT:        # the POST and the whole job: what the node does around them
                    _wrap(module.VideoClient, method, lambda a, k: None)
        _BRIDGED.append("")
    return node


def install() -> None:
    import execution
    import server
    from comfy_execution import caching, graph, progress

    _wrap(execution, "execute", lambda a, k: _bridge_wrapped(a[3]))
    _wrap(execution, "get_input_data", lambda a, k: a[2])
    _wrap(execution, "_async_map_node_over_list", lambda a, k: a[1])
    _wrap(execution, "get_output_from_returns", lambda a, k: None)
    for cls in (caching.HierarchicalCache, caching.LRUCache, caching.DependencyAwareCache):
        _wrap(cls, "set", lambda a, k: a[1])
    _wrap(progress.ProgressRegistry, "start_progress", lambda a, k: a[1])
    _wrap(progress.ProgressRegistry, "finish_progress", lambda a, k: a[1])
    _wrap(graph.ExecutionList, "stage_node_execution", lambda a, k: None)
    _wrap(graph.ExecutionList, "complete_node_execution", lambda a, k: None)

    send_sync = server.PromptServer.send_sync

    def marked_send_sync(self, event, data, sid=None):
        node = data.get("node") if isinstance(data, dict) else None
        mark(f"send:{event}", node)
        return send_sync(self, event, data, sid)

    server.PromptServer.send_sync = marked_send_sync

    from aiohttp import web

    @server.PromptServer.instance.routes.get("/overhead_probe/marks")
    async def marks(request):
        out = [list(m) for m in MARKS]
        MARKS.clear()
        return web.json_response(out)


def _image(frames: int, height: int, width: int, layout: str) -> "torch.Tensor":
    """One preallocated float32 IMAGE per shape and layout, made once (never inside a timed call)."""
    import numpy as np
    import torch

    key = (frames, height, width, layout)
    if key not in _TENSORS:
        _TENSORS.clear()
        if layout == "contiguous":
            array = np.random.default_rng(0).random((frames, height, width, 3), dtype=np.float32)
            _TENSORS[key] = torch.from_numpy(array)
        else:                            # the same shape as a channels-first buffer seen channels-last
            _TENSORS[key] = torch.rand(frames, 3, height, width).permute(0, 2, 3, 1)
    return _TENSORS[key]


def _video(megabytes: int):
    from comfy_api.v0_0_2 import InputImpl

    if megabytes not in _VIDEOS:
        _VIDEOS.clear()
        _VIDEOS[megabytes] = os.urandom(megabytes * 1_000_000)
    return InputImpl.VideoFromFile(io.BytesIO(_VIDEOS[megabytes]))


def node_list() -> list:
    from comfy_api.v0_0_2 import io as cio

    class OverheadProbeImage(cio.ComfyNode):
        @classmethod
        def define_schema(cls):
            return cio.Schema(
                node_id="OverheadProbeImage", display_name="Overhead Probe Image", category="testing",
                inputs=[cio.Int.Input("frames", default=121, min=1, max=1000),
                        cio.Int.Input("width", default=1280, min=8, max=4096),
                        cio.Int.Input("height", default=704, min=8, max=4096),
                        cio.Int.Input("video_mb", default=67, min=0, max=1000),
                        cio.Combo.Input("layout", options=["contiguous", "permuted"], default="contiguous"),
                        cio.Int.Input("seed", default=0, min=0, max=2**31)],
                outputs=[cio.Image.Output(), cio.Float.Output(), cio.Video.Output()],
                hidden=[cio.Hidden.unique_id])

        @classmethod
        def prepare(cls, frames, width, height, video_mb, layout):
            return _image(frames, height, width, layout), (_video(video_mb) if video_mb else None)

        @classmethod
        def execute(cls, frames, width, height, video_mb, layout, seed):
            image, video = _PREPARED.get((frames, width, height, video_mb, layout)) or (None, None)
            mark("fn>", cls.hidden.unique_id)
            if image is None:            # first call of a shape: made here, the run is a warm-up
                image, video = cls.prepare(frames, width, height, video_mb, layout)
                _PREPARED.clear()
                _PREPARED[(frames, width, height, video_mb, layout)] = (image, video)
            out = cio.NodeOutput(image, 24.0, video)
            mark("fn<", cls.hidden.unique_id)
            return out

    return [OverheadProbeImage]


_PREPARED: dict[tuple, tuple] = {}
