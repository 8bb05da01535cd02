"""The stub's post-job fault triggers: job counters, the engine crash and the wedged API server.

The knobs (``VLLM_OMNI_STUB_CRASH_AFTER_JOBS`` and friends) are read in ``stub_serve_knobs``;
this module acts on them once the N-th job has completed.  Imported after the entry point chose
the job storage directory, which it watches for a stored MP4.
"""
from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
import traceback
from typing import Any

import upstream
from stub_serve_knobs import KNOBS
from vllm.v1.engine.exceptions import EngineDeadError

# An executor below is the StubGpuExecutor (stub_serve_gpu imports this module, so its type stays Any).
StubGpuExecutor = Any
STORAGE_DIR = os.environ.get("VLLM_OMNI_SERVER_STORAGE__PATH") or os.environ.get("VLLM_OMNI_STORAGE_PATH")


class Faults:
    """Job counters and the post-job crash / hang triggers.

    A job has *started* when the engine hands it to the executor (the warm-up does not
    count).  An async job (``video_gen_*``) has *completed* once the API layer stored its
    MP4 (a job deleted while running never completes); any other request (``/sync``)
    completes when the executor returns its output.
    """

    lock = threading.Lock()
    started = 0
    completed = 0

    @classmethod
    def job_started(cls) -> int:
        with cls.lock:
            cls.started += 1
            return cls.started

    @classmethod
    def engine_finished(cls, request_id: str, executor: "StubGpuExecutor") -> None:
        if KNOBS.crash_after_jobs is None and KNOBS.hang_after_jobs is None:
            return
        threading.Thread(target=cls._watch, args=(request_id, executor), daemon=True,
                         name="stub-job-watch").start()

    @classmethod
    def _watch(cls, request_id: str, executor: "StubGpuExecutor") -> None:
        if request_id.startswith("video_gen_") and STORAGE_DIR:
            video_id = request_id.rsplit("-", 1)[0]
            path = os.path.join(STORAGE_DIR, video_id)
            deadline = time.monotonic() + 120.0
            while not os.path.exists(path):
                if time.monotonic() > deadline:
                    return  # deleted / aborted / never stored: not a completed job
                time.sleep(0.05)
        with cls.lock:
            cls.completed += 1
            n = cls.completed
        for limit, action in ((KNOBS.crash_after_jobs, crash), (KNOBS.hang_after_jobs, hang_api_server)):
            if limit is not None and n == limit:
                time.sleep(KNOBS.fault_grace_s)
                action(executor)


def _kill_children() -> None:
    try:
        import psutil

        for child in psutil.Process().children(recursive=True):
            try:
                child.kill()
            except Exception:
                pass
    except Exception:
        pass


def crash(executor: "StubGpuExecutor") -> None:
    """The engine dies: worker failure lines, failure callbacks, EngineDeadError, exit 1."""
    log = executor.log
    try:
        if executor.separate_workers:
            log.emit("workers_died", logging.ERROR,
                     [f"DiffusionWorker-{r}(exitcode=-9, SIGKILL)" for r in range(executor.world_size)])
        else:
            log.emit("device_unusable", logging.ERROR, "CUDA error: an illegal memory access was encountered")
            log.emit("worker_dead", logging.ERROR)
        executor.mark_failed()
        sys.stderr.write("".join(traceback.format_exception_only(EngineDeadError())))
        sys.stderr.flush()
        sys.stdout.flush()
    finally:
        _kill_children()
        upstream.remove_temp_dirs()
        os._exit(1)


def hang_api_server(executor: "StubGpuExecutor | None" = None) -> None:
    """Block the API server's event loop (the one running on the main thread) forever."""
    import asyncio
    import gc

    scheduled = False
    for obj in gc.get_objects():
        try:
            if isinstance(obj, asyncio.AbstractEventLoop) and obj.is_running():
                obj.call_soon_threadsafe(_block_if_main_thread)
                scheduled = True
        except Exception:
            continue
    if not scheduled:  # no loop found: stop the whole process instead (also "alive but silent")
        os.kill(os.getpid(), signal.SIGSTOP)


def _block_if_main_thread() -> None:
    if threading.current_thread() is threading.main_thread():
        while True:
            time.sleep(3600)
