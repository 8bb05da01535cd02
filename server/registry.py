"""The one table of servers this process owns, and the exit hooks that stop them.

ComfyUI imports custom nodes once and keeps them for the life of the process, so a
module-level registry is the natural owner: every node that asks for the same launch spec
(same fingerprint) gets the same Supervisor while it is alive. A different spec on
overlapping GPUs (None = every GPU, overlapping everything) stops the old server first;
two servers must never compete for one GPU's memory.

On start it also sweeps the servers an earlier ComfyUI left behind (adoption.py): a
verified, healthy one with the same spec is adopted, any other verified one is stopped, and
a pid that cannot be proven to be that server is never signalled. Across processes, the GPU
lock (gpu_lock.py) refuses a second server on a GPU another launcher already uses.

This is the one entry point for nodes and the CLI: they import the names below from here.
"""
from __future__ import annotations

import atexit
import os
import signal
import threading
from typing import Any, Callable, Optional

from .config.local_config import LocalConfig, load_local_config
from .launch import lora_files
from .launch.spec import LaunchSpec
from .logs.failures import LaunchCancelled, ServerFailure
from .process import cancel_wait, timeouts
from .process.process_group import group_members
from .supervision import adoption
from .supervision.multi_host import HeadRole, JoinRole, ServerRole
from .supervision.status import Status, StatusCallback
from .supervision.supervisor import Fallback, Supervisor

__all__ = ["Supervisor", "Status", "LaunchCancelled", "ServerFailure", "ServerRole", "HeadRole", "JoinRole",
           "group_members", "all_servers", "find", "get_or_start", "stop", "stop_all", "install_exit_handlers",
           "gpus_overlap"]

_servers: list[Supervisor] = []
_table_lock = threading.Lock()         # short: list edits and lookups
_start_lock = threading.RLock()        # long: one get_or_start decision at a time
_hooks_installed = False
_previous_handlers: dict[int, Any] = {}


def all_servers() -> list[Supervisor]:
    with _table_lock:
        return list(_servers)


def find(fingerprint: str) -> Optional[Supervisor]:
    """The supervisor for a spec fingerprint (as asked for, or as running after a fallback)."""
    with _table_lock:
        for sup in _servers:
            if fingerprint in (sup.requested_spec.fingerprint(), sup.spec.fingerprint()):
                return sup
    return None


def _register(sup: Supervisor) -> None:
    with _table_lock:
        if sup not in _servers:
            _servers.append(sup)


def _unregister(sup: Supervisor) -> None:
    with _table_lock:
        if sup in _servers:
            _servers.remove(sup)


def _lora_paths_in_use() -> list[str]:
    """The startup LoRA files of this process's servers, as run and as asked for (lora_files keeps
    those copies: a supervisor restarting one has no state file until it is back)."""
    return [path for sup in all_servers() for path in sup.spec.lora.lora_paths + sup.requested_spec.lora.lora_paths]


lora_files.add_in_use_source(_lora_paths_in_use)


def gpus_overlap(a: Optional[tuple[int, ...]], b: Optional[tuple[int, ...]]) -> bool:
    if a is None or b is None:
        return True
    return bool(set(a) & set(b))


def get_or_start(spec: LaunchSpec, config: Optional[LocalConfig] = None, *, fallback: Optional[Fallback] = None,
                 on_status: Optional[StatusCallback] = None, keep_alive_minutes: Optional[float] = None,
                 should_cancel: Optional[Callable[[], bool]] = None,
                 on_wait: Optional[Callable[[], None]] = None) -> Supervisor:
    """Return a ready server for `spec`, reusing, adopting or starting one.

    Same spec and alive: reuse. Stopped by keep-alive or crashed for good: start it again
    (same Supervisor, next generation). Otherwise stop every server on overlapping GPUs,
    then adopt a verified left-behind server with this spec, or start a new one.
    Blocks until ready; raises LauncherError with what to change, and LaunchCancelled
    (its processes gone within 2 s) once `should_cancel()` turns true. `on_wait` is told, before
    the wait, that another start holds the start lock (so a node can say what it waits for).
    """
    config = config or load_local_config()
    install_exit_handlers()
    fingerprint = spec.fingerprint()
    if not _start_lock.acquire(blocking=False):        # one decision at a time: another start holds it
        if on_wait is not None:
            on_wait()
        if not cancel_wait.acquire(_start_lock, cancel_wait.quiet(should_cancel)):
            raise LaunchCancelled("waiting for another server start to finish")
    try:
        sup = find(fingerprint)
        if sup is not None:
            if keep_alive_minutes is not None:
                sup.keep_alive_minutes = keep_alive_minutes
            if fallback is not None:
                sup.fallback = fallback
            if sup.ready():
                sup.mark_job_activity()
                if on_status is not None:
                    sup.listen(on_status, replay=True)
                return sup
            _stop_overlapping(spec, keep=sup)
            sup.start(on_status, should_cancel=should_cancel)
            return sup
        _stop_overlapping(spec)
        owned = {s.pgid for s in all_servers()}
        adopted = adoption.sweep_left_behind(config, spec, owned, fallback, keep_alive_minutes)
        if adopted is not None:
            if on_status is not None:
                adopted.listen(on_status, replay=True)
            _register(adopted)
            return adopted
        sup = Supervisor(spec, config, fallback, keep_alive_minutes=keep_alive_minutes)
        _register(sup)
        try:
            sup.start(on_status, should_cancel=should_cancel)
        except BaseException:
            sup.stop(timeout=timeouts.REPLACE_STOP_S)
            _unregister(sup)
            raise
        return sup
    finally:
        _start_lock.release()


def _stop_overlapping(spec: LaunchSpec, keep: Optional[Supervisor] = None) -> None:
    for other in all_servers():
        if other is keep:
            continue
        if gpus_overlap(other.spec.gpus, spec.gpus) or gpus_overlap(other.requested_spec.gpus, spec.gpus):
            other.stop()
            _unregister(other)


def stop(fingerprint: str, timeout: float = timeouts.STOP_S) -> bool:
    """Stop and forget the server with this fingerprint; False when there was none."""
    sup = find(fingerprint)
    if sup is None:
        return False
    sup.stop(timeout=timeout)
    _unregister(sup)
    return True


def stop_all(timeout: float = timeouts.STOP_S) -> None:
    """Stop every server this process owns, in parallel (exit paths have little time)."""
    servers = all_servers()
    threads = [threading.Thread(target=s.stop, kwargs={"timeout": timeout}, daemon=True) for s in servers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 10)
    for s in servers:
        _unregister(s)


# ---- exit hooks ----------------------------------------------------------------------------
def _atexit_stop() -> None:
    stop_all(timeout=timeouts.EXIT_STOP_S)


def _on_signal(signum: int, frame: Any) -> None:
    stop_all(timeout=timeouts.EXIT_STOP_S)
    previous = _previous_handlers.get(signum, signal.SIG_DFL)
    if callable(previous):
        previous(signum, frame)
    elif previous == signal.SIG_DFL:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


def install_exit_handlers() -> bool:
    """atexit always; SIGTERM/SIGINT handlers that chain to the previous ones, when called
    on the main thread (Python allows signal handlers only there). ComfyUI's prompt worker
    is not the main thread, so the node package should call this at import time; the
    watchdog covers the rest (SIGKILL, or handlers that never ran). Returns True when the
    signal handlers are in place."""
    global _hooks_installed
    with _table_lock:
        first = not _hooks_installed
        _hooks_installed = True
    if first:
        atexit.register(_atexit_stop)
    if threading.current_thread() is not threading.main_thread():
        return bool(_previous_handlers)
    for sig in (signal.SIGTERM, signal.SIGINT):
        current = signal.getsignal(sig)
        if current is _on_signal:
            continue
        try:
            signal.signal(sig, _on_signal)
        except (ValueError, OSError):
            return False
        _previous_handlers[sig] = current
    return True
