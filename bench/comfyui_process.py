"""The live side of the ComfyUI end-to-end run (bench/gpu_comfyui_e2e.py): a ComfyUI process as a user
runs it, its websocket read in a thread, and what /proc says of the server processes it started.
"""
from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Callable, Optional

from comfy_harness import PACK_NAME, ComfyUI
from comfyui_e2e_reading import PKG, binary_event


class Websocket:
    """ComfyUI's /ws for one client id, read in a thread; every event with its arrival time."""

    def __init__(self, url: str, client_id: str) -> None:
        self.url = url.replace("http://", "ws://") + f"/ws?clientId={client_id}"
        self.events: list[dict] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError(f"websocket {self.url} did not connect")

    async def _run(self) -> None:
        import aiohttp

        async with aiohttp.ClientSession() as session:
            async with session.ws_connect(self.url, heartbeat=20) as ws:
                self._ready.set()
                while not self._stop.is_set():
                    try:
                        msg = await ws.receive(timeout=0.5)
                    except asyncio.TimeoutError:
                        continue
                    if msg.type == aiohttp.WSMsgType.TEXT:
                        data = json.loads(msg.data)
                        self._add({"type": data.get("type"), "data": data.get("data") or {}})
                    elif msg.type == aiohttp.WSMsgType.BINARY:
                        self._add(binary_event(msg.data))
                    elif msg.type in (aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.ERROR):
                        return

    def _add(self, event: dict) -> None:
        event["t"] = time.monotonic()
        with self._lock:
            self.events.append(event)

    def snapshot(self) -> list[dict]:
        with self._lock:
            return list(self.events)

    def wait_for(self, pred: Callable[[dict], bool], timeout: float, start: int = 0) -> Optional[dict]:
        """The first event from index ``start`` on that ``pred`` accepts (None after ``timeout``)."""
        deadline = time.monotonic() + timeout
        seen = start
        while time.monotonic() < deadline:
            events = self.snapshot()
            for e in events[seen:]:
                if pred(e):
                    return e
            seen = len(events)
            time.sleep(0.02)
        return None

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)


class Comfy(ComfyUI):
    """A ComfyUI process as a user runs it: ``main.py --listen 127.0.0.1`` (``--cpu`` only in the
    rehearsal), the pack under ``<base>/custom_nodes``, no front end (an empty ``--front-end-root``)."""

    def __init__(self, comfy_dir: Path, python: str, env: dict[str, str], base: Path, cpu: bool,
                 extra_args: tuple[str, ...] = ()) -> None:
        from comfy_harness import free_port

        self.comfy_dir = Path(comfy_dir).resolve()
        self.python = python
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.base = base
        for sub in ("custom_nodes", "input", "output", "user", "models/diffusers", "empty-front-end"):
            (base / sub).mkdir(parents=True, exist_ok=True)
        link = base / "custom_nodes" / PACK_NAME
        if link.is_symlink() and link.resolve() != PKG:   # a link left by an earlier call's copy
            link.unlink()
        if not link.is_symlink():
            link.symlink_to(PKG, target_is_directory=True)
        example = self.comfy_dir / "input" / "example.png"
        if example.is_file():
            shutil.copy2(example, base / "input" / "example.png")
        self.log_path = base / "comfyui.log"
        child_env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        child_env.update(env)
        child_env["PYTHONUNBUFFERED"] = "1"
        self.argv = [python, str(self.comfy_dir / "main.py"), *(["--cpu"] if cpu else []),
                     "--listen", "127.0.0.1", "--port", str(self.port), "--base-directory", str(base),
                     "--disable-all-custom-nodes", "--whitelist-custom-nodes", PACK_NAME,
                     "--disable-auto-launch", "--database-url", "sqlite:///:memory:",
                     "--front-end-root", str(base / "empty-front-end"), *extra_args]
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(self.argv, cwd=str(self.comfy_dir), stdin=subprocess.DEVNULL,
                                     stdout=self._log, stderr=subprocess.STDOUT, env=child_env,
                                     start_new_session=True)


def server_env_var(pid: int, name: str) -> Optional[str]:
    """One variable of a server process's environment (ComfyUI's cuda_malloc sets
    PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync in its own process, and the launcher passes
    PYTORCH_* on). Only that name is read: the environment also holds the server's API key."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    prefix = name.encode() + b"="
    return next((v[len(prefix):].decode(errors="replace") for v in raw.split(b"\0") if v.startswith(prefix)), None)


def process_state(pid: int) -> Optional[str]:
    """A process's state letter from /proc (Z: a zombie, gone but not reaped)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None
