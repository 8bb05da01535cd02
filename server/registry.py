"""The one table of servers this process owns, and the exit hooks that stop them.

ComfyUI imports custom nodes once and keeps them for the life of the process, so a
module-level registry is the natural owner: every node that asks for the same launch spec
(same fingerprint) gets the same Supervisor while it is alive. A different spec on
overlapping GPUs (None = every GPU, overlapping everything) stops the old server first;
two servers must never compete for one GPU's memory.

On start it also looks at the state files in the data dir for servers an earlier ComfyUI
left behind (its watchdog normally stops them; see watchdog.py): a verified, healthy one
with the same spec is adopted, any other verified one is stopped, and a pid that cannot be
proven to be that server is never signalled.
"""
from __future__ import annotations

import atexit
import os
import signal
import threading
from typing import TYPE_CHECKING, Any, Optional

from . import probe, process_group, state_file
from .local_config import LocalConfig, default_data_dir, load_local_config
from .spec import LaunchSpec

if TYPE_CHECKING:
    from .supervisor import Fallback, StatusCallback, Supervisor

_servers: list["Supervisor"] = []
_table_lock = threading.Lock()         # short: list edits and lookups
_start_lock = threading.RLock()        # long: one get_or_start decision at a time
_hooks_installed = False
_previous_handlers: dict[int, Any] = {}


def all_servers() -> list["Supervisor"]:
    with _table_lock:
        return list(_servers)


def find(fingerprint: str) -> Optional["Supervisor"]:
    """The supervisor for a spec fingerprint (as asked for, or as running after a fallback)."""
    with _table_lock:
        for sup in _servers:
            if fingerprint in (sup.requested_spec.fingerprint(), sup.spec.fingerprint()):
                return sup
    return None


def _register(sup: "Supervisor") -> None:
    with _table_lock:
        if sup not in _servers:
            _servers.append(sup)


def _unregister(sup: "Supervisor") -> None:
    with _table_lock:
        if sup in _servers:
            _servers.remove(sup)


def gpus_overlap(a: Optional[tuple[int, ...]], b: Optional[tuple[int, ...]]) -> bool:
    if a is None or b is None:
        return True
    return bool(set(a) & set(b))


def get_or_start(spec: LaunchSpec, config: Optional[LocalConfig] = None, *, fallback: Optional["Fallback"] = None,
                 on_status: Optional["StatusCallback"] = None,
                 keep_alive_minutes: Optional[float] = None) -> "Supervisor":
    """Return a ready server for `spec`, reusing, adopting or starting one.

    Same spec and alive: reuse. Stopped by keep-alive or crashed for good: start it again
    (same Supervisor, next generation). Otherwise stop every server on overlapping GPUs,
    then adopt a verified left-behind server with this spec, or start a new one.
    Blocks until ready; raises LauncherError with what to change.
    """
    from .supervisor import Supervisor

    config = config or load_local_config()
    install_exit_handlers()
    fingerprint = spec.fingerprint()
    with _start_lock:
        sup = find(fingerprint)
        if sup is not None:
            if keep_alive_minutes is not None:
                sup.keep_alive_minutes = keep_alive_minutes
            if fallback is not None:
                sup.fallback = fallback
            if sup.ready():
                sup.mark_job_activity()
                if on_status is not None:
                    sup._on_status = on_status
                    sup._emit()
                return sup
            _stop_overlapping(spec, keep=sup)
            sup.start(on_status)
            return sup
        _stop_overlapping(spec)
        adopted = _sweep_left_behind(config, spec, fallback, keep_alive_minutes)
        if adopted is not None:
            if on_status is not None:
                adopted._on_status = on_status
                adopted._emit()
            _register(adopted)
            return adopted
        sup = Supervisor(spec, config, fallback, keep_alive_minutes=keep_alive_minutes)
        _register(sup)
        try:
            sup.start(on_status)
        except BaseException:
            sup.stop(timeout=10)
            _unregister(sup)
            raise
        return sup


def _stop_overlapping(spec: LaunchSpec, keep: Optional["Supervisor"] = None) -> None:
    for other in all_servers():
        if other is keep:
            continue
        if gpus_overlap(other.spec.gpus, spec.gpus) or gpus_overlap(other.requested_spec.gpus, spec.gpus):
            other.stop()
            _unregister(other)


def stop(fingerprint: str, timeout: float = 30.0) -> bool:
    """Stop and forget the server with this fingerprint; False when there was none."""
    sup = find(fingerprint)
    if sup is None:
        return False
    sup.stop(timeout=timeout)
    _unregister(sup)
    return True


def stop_all(timeout: float = 30.0) -> None:
    """Stop every server this process owns, in parallel (exit paths have little time)."""
    servers = all_servers()
    threads = [threading.Thread(target=s.stop, kwargs={"timeout": timeout}, daemon=True) for s in servers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 10)
    for s in servers:
        _unregister(s)


# ---- left-behind servers -------------------------------------------------------------------
def _owner_alive(st: state_file.ServerState) -> bool:
    """Another live process (not us) still owns this server: not ours to touch."""
    if st.owner_pid == os.getpid():
        return False        # we hold no such server in memory, so an earlier image of us left it (exec)
    created = process_group.create_time(st.owner_pid)
    return created is not None and st.owner_create_time is not None and abs(created - st.owner_create_time) < 0.05


def _verified(st: state_file.ServerState) -> bool:
    """The recorded server pid is alive, is the process we launched (create time and exact
    argv) and still sits in the recorded process group."""
    if st.server_pid is None or st.server_create_time is None:
        return False
    created = process_group.create_time(st.server_pid)
    if created is None or abs(created - st.server_create_time) >= 0.05:
        return False
    if not process_group.verify_cmdline(st.server_pid, st.argv):
        return False
    try:
        return os.getpgid(st.server_pid) == st.pgid
    except ProcessLookupError:
        return False


def _healthy(st: state_file.ServerState, served_name: str) -> bool:
    if probe.health(st.host, st.port, timeout=2.0) != 200:
        return False
    names = probe.served_models(st.host, st.port, st.api_key, timeout=3.0)
    return names is not None and served_name in names


def _sweep_left_behind(config: LocalConfig, spec: LaunchSpec, fallback: Optional["Fallback"],
                       keep_alive_minutes: Optional[float]) -> Optional["Supervisor"]:
    from .supervisor import Supervisor

    data_dir = config.data_dir or default_data_dir()
    owned = {s.pgid for s in all_servers()}
    adopted: Optional[Supervisor] = None
    for path, st in state_file.read_all(data_dir):
        if st is None or st.pgid in owned or _owner_alive(st):
            continue
        if not _verified(st):
            path.unlink(missing_ok=True)    # dead, or not provably ours: forget it, signal nothing
            continue
        proc = process_group.ServerProcess(pgid=st.pgid, leader_create_time=st.leader_create_time,
                                           server_pid=st.server_pid, server_create_time=st.server_create_time,
                                           adopted=True)
        wanted = spec.fingerprint() in (st.fingerprint, st.requested_fingerprint)
        served = LaunchSpec.from_dict(st.spec).served_name
        if adopted is None and wanted and _healthy(st, served):
            adopted = Supervisor.adopt(st, config, spec, fallback, keep_alive_minutes)
            continue
        proc.stop(timeout=15, graceful=True)
        path.unlink(missing_ok=True)
    return adopted


# ---- exit hooks ----------------------------------------------------------------------------
def _atexit_stop() -> None:
    stop_all(timeout=10)


def _on_signal(signum: int, frame: Any) -> None:
    stop_all(timeout=10)
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


def _forget_all_for_tests() -> None:
    """Drop every supervisor without stopping it (simulates a new process in tests)."""
    with _table_lock:
        _servers.clear()


