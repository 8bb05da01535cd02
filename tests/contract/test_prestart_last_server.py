"""`prestart_last_server` end to end against the stub server: Local Server records its choices, the
prestart (what ComfyUI's load of the pack runs) starts the same server from them, and a Local Server
queued while that start holds the registry's start lock waits for it and reuses it: one launch."""
from __future__ import annotations

import os
import re
import stat
import threading
from typing import Any, Optional

from comfy_standin import ComfyStandIn, run_node
from stubserver import STUB_SCRIPT, server_python
from vllm_omni_launcher.nodes import last_choices, prestart
from vllm_omni_launcher.server import registry
from vllm_omni_launcher.server.storage import last_server

TI2V = "Wan-AI/Wan2.2-TI2V-5B-Diffusers"
WAIT_S = 120.0          # a bound on event waits only (a wedged test fails instead of hanging)
WAITING = re.compile(r"Waiting for the server prestart_last_server is starting \(started \d+ s ago, when ComfyUI "
                     r"loaded the pack\): this node uses that server once it is ready")


class _WatchedStartLock:
    """The registry's start lock, telling the test when the prestart holds it and keeping it held
    until another start has waited for it (so the Local Server below surely queues behind the prestart),
    and until `hold_until` is set where given."""

    def __init__(self, hold_until: Optional[threading.Event] = None) -> None:
        self._lock = threading.RLock()
        self.prestart_holds = threading.Event()
        self.another_waited = threading.Event()
        self.hold_until = hold_until

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        got = self._lock.acquire(blocking, timeout)
        if not got:
            self.another_waited.set()
        elif threading.current_thread().name == prestart.THREAD_NAME and not self.prestart_holds.is_set():
            self.prestart_holds.set()
            self.another_waited.wait(WAIT_S)
            if self.hold_until is not None:
                self.hold_until.wait(WAIT_S)
        return got

    def release(self) -> None:
        self._lock.release()


def _serving():
    return run_node("VLLMOmniServingConfig", gpus="all", parallel_mode="none", parallel_degree=1,
                    vae_patch_parallel=1, offload="none", fp8=False, vae_tiling=False, cache_backend="none",
                    compile=False, keep_alive_minutes=0, auto_fallback=False)[0]


def test_local_server_records_its_choices_and_the_prestart_starts_that_server_which_a_queued_local_server_reuses(
        tmp_path, monkeypatch, capsys):
    registry.stop_all()
    monkeypatch.setenv("VLLM_OMNI_LAUNCHER_SERVER_CMD", f"{server_python()} {STUB_SCRIPT}")
    monkeypatch.setenv("VLLM_OMNI_LAUNCHER_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("VLLM_OMNI_LAUNCHER_GPU_MEMORY_GB", "80")
    try:
        with ComfyStandIn():
            model = run_node("VLLMOmniLoadModel", TI2V)[0]
            first = run_node("VLLMOmniLocalServer", model, _serving(), unique_id="srv")[0]

            # (a) the record: private, secret-free, the same choices and fingerprint
            path = last_server.record_path(str(tmp_path))
            assert stat.S_IMODE(os.lstat(path).st_mode) == 0o600
            assert registry.find(first.server_id).api_key not in path.read_text()
            entry = last_server.read(str(tmp_path))
            assert entry["fingerprint"] == first.server_id
            assert last_choices.choices(entry) == (first.model, first.serving)
            registry.stop_all()                       # as after ComfyUI restarts: no server

            # (b, e) the prestart starts it; a Local Server queued meanwhile waits, then reuses it
            lock = _WatchedStartLock()
            monkeypatch.setattr(registry, "_start_lock", lock)
            monkeypatch.setenv("VLLM_OMNI_LAUNCHER_PRESTART_LAST_SERVER", "1")
            capsys.readouterr()
            starting = prestart.maybe_start()
            assert starting is not None and lock.prestart_holds.wait(WAIT_S)
            result: dict = {}
            queued = threading.Thread(target=lambda: result.update(
                handle=run_node("VLLMOmniLocalServer", model, _serving(), unique_id="srv2")[0]))
            queued.start()
            queued.join(WAIT_S)
            starting.join(WAIT_S)
            assert lock.another_waited.is_set() and not queued.is_alive() and not starting.is_alive()

            servers = registry.all_servers()
            assert len(servers) == 1 and servers[0].generation == 1, "one launch: the prestart's"
            assert result["handle"].server_id == entry["fingerprint"] == servers[0].spec.fingerprint()
            lines = [line for line in capsys.readouterr().out.splitlines() if last_server.SETTING in line]
            assert len(lines) == 2 and "starting" in lines[0] and "as the last Local Server did" in lines[0]
            assert "ready at" in lines[1] and servers[0].log_path in lines[1]
    finally:
        registry.stop_all()


class _NodeTexts(list):
    """ComfyStandIn's record of the texts under the nodes, setting `shown` once `node` shows a text that
    `pattern` matches whole."""

    def __init__(self, node: str, pattern: re.Pattern) -> None:
        super().__init__()
        self.node, self.pattern, self.shown = node, pattern, threading.Event()

    def append(self, item: Any) -> None:
        super().append(item)
        if item[1] == self.node and self.pattern.fullmatch(item[0]):
            self.shown.set()


def test_a_local_server_queued_during_the_prestart_says_it_waits_for_that_server_then_shows_it_ready(
        tmp_path, monkeypatch):
    registry.stop_all()
    monkeypatch.setenv("VLLM_OMNI_LAUNCHER_SERVER_CMD", f"{server_python()} {STUB_SCRIPT}")
    monkeypatch.setenv("VLLM_OMNI_LAUNCHER_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("VLLM_OMNI_LAUNCHER_GPU_MEMORY_GB", "80")
    try:
        with ComfyStandIn() as standin:
            model = run_node("VLLMOmniLoadModel", TI2V)[0]
            run_node("VLLMOmniLocalServer", model, _serving(), unique_id="srv")       # the record
            registry.stop_all()                       # as after ComfyUI restarts: no server

            # the prestart keeps the start lock until the queued node has shown that it waits for it
            texts = _NodeTexts("srv2", WAITING)
            standin.texts = texts
            lock = _WatchedStartLock(hold_until=texts.shown)
            monkeypatch.setattr(registry, "_start_lock", lock)
            monkeypatch.setenv("VLLM_OMNI_LAUNCHER_PRESTART_LAST_SERVER", "1")
            starting = prestart.maybe_start()
            assert starting is not None and lock.prestart_holds.wait(WAIT_S)
            queued = threading.Thread(target=run_node, args=("VLLMOmniLocalServer", model, _serving()),
                                      kwargs={"unique_id": "srv2"})
            queued.start()
            queued.join(WAIT_S)
            starting.join(WAIT_S)
            assert texts.shown.is_set() and not queued.is_alive() and not starting.is_alive()

            shown = [text for text, node in texts if node == "srv2"]
            waiting = [i for i, text in enumerate(shown) if WAITING.fullmatch(text)]
            assert len(waiting) == 1 and shown[0] == "Planning the launch" and waiting[0] > 0, shown
            after = shown[waiting[0] + 1:]
            assert after and all(text.startswith("Ready") for text in after), "then the reused server, ready"
            assert len(registry.all_servers()) == 1, "one launch: the prestart's"
    finally:
        registry.stop_all()
