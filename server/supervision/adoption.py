"""Servers an earlier launcher process left running: adopt the one we want, stop the rest.

The watchdog normally stops a server when its owner dies (watchdog.py), but a server can
still be left behind (the watchdog itself was killed, a crash between two steps). Each
server's state file (state_file.py) records what proves a process is that server. On a
start the registry sweeps them: a state file whose owner still lives belongs to someone
else and is left alone; one whose process cannot be proven to be our server (create time,
exact argv, process group) is forgotten and nothing is signalled; a verified, healthy one
with the wanted spec is adopted (Supervisor.attach); any other verified one is stopped.
"""
from __future__ import annotations

import os
from typing import Optional

from ..config.local_config import LocalConfig, default_data_dir
from ..launch.spec import LaunchSpec
from ..logs.failures import ServerFailure
from ..process import port_owner, probe, process_group, timeouts
from ..process.server_run import RunningServer
from ..storage import state_file
from .supervisor import Fallback, Supervisor


def owner_alive(st: state_file.ServerState) -> bool:
    """Another live process (not us) still owns this server: not ours to touch."""
    if st.owner_pid == os.getpid():
        return False        # we hold no such server in memory, so an earlier image of us left it (exec)
    created = process_group.create_time(st.owner_pid)
    return created is not None and st.owner_create_time is not None and abs(created - st.owner_create_time) < 0.05


def verified(st: state_file.ServerState) -> bool:
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


def healthy(st: state_file.ServerState, served_name: str) -> bool:
    if probe.health(st.host, st.port, timeout=timeouts.ADOPT_HEALTH_S) != 200:
        return False
    try:                        # its key goes only to a listener of its own process group
        if not port_owner.check_listener(probe.connect_host(st.host), st.port, st.pgid):
            return False
    except ServerFailure:
        return False
    names = probe.served_models(st.host, st.port, st.api_key, timeout=timeouts.ADOPT_MODELS_S)
    return names is not None and served_name in names


def sweep_left_behind(config: LocalConfig, spec: LaunchSpec, owned_pgids: set[Optional[int]],
                      fallback: Optional[Fallback], keep_alive_minutes: Optional[float]) -> Optional[Supervisor]:
    """Adopt the left-behind server for `spec` if there is a good one; stop the others."""
    data_dir = config.data_dir or default_data_dir()
    adopted: Optional[Supervisor] = None
    for path, st in state_file.read_all(data_dir):
        if st is None or st.pgid in owned_pgids or owner_alive(st):
            continue
        if not verified(st):
            path.unlink(missing_ok=True)    # dead, or not provably ours: forget it, signal nothing
            continue
        proc = process_group.ServerProcess(pgid=st.pgid, leader_create_time=st.leader_create_time,
                                           server_pid=st.server_pid, server_create_time=st.server_create_time,
                                           adopted=True)
        running_spec = LaunchSpec.from_dict(st.spec)
        if adopted is None and spec.fingerprint() in (st.fingerprint, st.requested_fingerprint) \
                and healthy(st, running_spec.served_name):
            running = RunningServer(proc, running_spec, st.port, st.log_path, list(st.argv), api_key=st.api_key)
            try:
                adopted = Supervisor.attach(running, config, spec, fallback, keep_alive_minutes)
                continue
            except ServerFailure:
                pass                        # its GPUs are held by another live launcher: do not keep it
        proc.stop(timeout=timeouts.LEFT_BEHIND_STOP_S, graceful=True)
        path.unlink(missing_ok=True)
    return adopted
