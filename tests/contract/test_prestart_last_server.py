"""`prestart_last_server` end to end against the stub server: Local Server records its choices, the
prestart (what ComfyUI's load of the pack runs) starts the same server from them, and a Local Server
queued while that start holds the registry's start lock waits for it and reuses it: one launch."""
from __future__ import annotations

import os
import stat
import threading

from comfy_standin import ComfyStandIn, run_node
from stubserver import STUB_SCRIPT, server_python
from vllm_omni_launcher.nodes import last_choices, prestart
from vllm_omni_launcher.server import registry
from vllm_omni_launcher.server.storage import last_server

TI2V = "Wan-AI/Wan2.2-TI2V-5B-Diffusers"
WAIT_S = 120.0          # a bound on event waits only (a wedged test fails instead of hanging)


class _WatchedStartLock:
    """The registry's start lock, telling the test when the prestart holds it and keeping it held
    until another start has waited for it (so the Local Server below surely queues behind the prestart)."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self.prestart_holds = threading.Event()
        self.another_waited = threading.Event()

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        got = self._lock.acquire(blocking, timeout)
        if not got:
            self.another_waited.set()
        elif threading.current_thread().name == prestart.THREAD_NAME and not self.prestart_holds.is_set():
            self.prestart_holds.set()
            self.another_waited.wait(WAIT_S)
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
