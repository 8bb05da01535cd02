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

It is also the one owner of which server a node's handle uses: a handle names the fingerprint of the
spec it was planned for, and a job that planned again for itself (`auto` CFG parallel meeting jobs
without CFG) records with `replan` the server it got; `find` follows that record for as long as the
server it names is in the table, so every later job, report and stop of the handle reaches it.

This is the one entry point for nodes and the CLI: they import the names below from here (the stop
deadlines too, which a systemd unit's stop timeout must cover).
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
from .process.gpu_lock import describe as describe_gpus
from .process.process_group import group_members
from .process.timeouts import REPLACE_STOP_S, STOP_S
from .supervision import adoption
from .supervision.multi_host import HeadRole, JoinRole, ServerRole
from .supervision.status import STOPPING, Status, StatusCallback
from .supervision.supervisor import Fallback, Supervisor

__all__ = ["Supervisor", "Status", "LaunchCancelled", "ServerFailure", "ServerRole", "HeadRole", "JoinRole",
           "group_members", "all_servers", "find", "replan", "get_or_start", "stop", "stop_all",
           "install_exit_handlers", "gpus_overlap", "describe_gpus", "STOP_S", "REPLACE_STOP_S"]

_servers: list[Supervisor] = []
_replanned: dict[str, str] = {}        # fingerprint asked for -> fingerprint of the server a re-plan gave it
_table_lock = threading.Lock()         # short: list edits and lookups
_start_lock = threading.RLock()        # long: one get_or_start decision at a time
_hooks_installed = False
_previous_handlers: dict[int, Any] = {}


def all_servers() -> list[Supervisor]:
    with _table_lock:
        return list(_servers)


def find(fingerprint: str) -> Optional[Supervisor]:
    """The supervisor that serves jobs asked of a spec fingerprint: the server a re-plan gave it
    (`replan`), else its own (as asked for, or as running after a fallback)."""
    with _table_lock:
        return _own(_replanned.get(fingerprint, fingerprint))


def replan(asked: str, running: str) -> None:
    """From now on the jobs asked of fingerprint `asked` use the server of fingerprint `running`, which a
    re-plan for them started (`find` follows it until that server leaves the table); `running` equal to
    `asked` (the re-plan came back to the handle's own spec) ends the record."""
    with _table_lock:
        if running == asked:
            _replanned.pop(asked, None)
        else:
            _replanned[asked] = running


def _own(fingerprint: str) -> Optional[Supervisor]:
    """The supervisor of exactly this fingerprint (no re-plan followed); the caller holds the table lock."""
    for sup in _servers:
        if fingerprint in _fingerprints(sup):
            return sup
    return None


def _fingerprints(sup: Supervisor) -> tuple[str, str]:
    return sup.requested_spec.fingerprint(), sup.spec.fingerprint()


def _register(sup: Supervisor) -> None:
    with _table_lock:
        if sup not in _servers:
            _servers.append(sup)


def _unregister(sup: Supervisor) -> None:
    """Forget a stopped or replaced server, and the re-plans that led to it: their handles' jobs plan
    (and start) their server again, as for any server no longer running."""
    with _table_lock:
        if sup in _servers:
            _servers.remove(sup)
        gone = _fingerprints(sup)
        for asked in [asked for asked, running in _replanned.items() if running in gone]:
            del _replanned[asked]


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
        with _table_lock:
            sup = _own(fingerprint)                    # this spec's own server: a spec asked for is never re-planned
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
            _stop_overlapping(spec, keep=sup, on_status=on_status)
            sup.start(on_status, should_cancel=should_cancel)
            return sup
        _stop_overlapping(spec, on_status=on_status)
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


def _stop_overlapping(spec: LaunchSpec, keep: Optional[Supervisor] = None,
                      on_status: Optional[StatusCallback] = None) -> None:
    """Stop this process's servers on GPUs `spec` needs, telling the launch that asked (`on_status`)
    which one stops and why, so a Local Server never stops another template's server silently."""
    for other in all_servers():
        if other is keep:
            continue
        if gpus_overlap(other.spec.gpus, spec.gpus) or gpus_overlap(other.requested_spec.gpus, spec.gpus):
            if on_status is not None:
                on_status(_stopping_status(other, spec))
            other.stop()
            _unregister(other)


def _stopping_status(other: Supervisor, spec: LaunchSpec) -> Status:
    """The new launch's status while `other` stops to free its GPUs."""
    gpus = other.spec.gpus if other.spec.gpus is not None else other.requested_spec.gpus
    one = gpus is not None and len(gpus) == 1
    where = "all GPUs" if gpus is None else f"GPU{'' if one else 's'} {','.join(map(str, gpus))}"
    freed = "it for" if one else "them for"
    return Status(phase=STOPPING, text=f"Stopping {other.spec.model} on {where} to free {freed} {spec.model} "
                  f"({'that server' if one else 'it'} starts again when a workflow needs it)", ready=False, pid=None,
                  port=None, url=None,
                  generation=0, fingerprint=spec.fingerprint(), requested_fingerprint=spec.fingerprint())


def stop(fingerprint: str, timeout: float = timeouts.STOP_S) -> bool:
    """Stop and forget the server that serves this fingerprint (`find`: a re-plan's server); False when
    there was none."""
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
