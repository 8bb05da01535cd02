"""Whose socket answers on our server's port: the launch key goes only to our own process group.

The port is in the server's argv, and vLLM-Omni binds it only once the model is loaded, so for
minutes another local program can listen there first: the readiness probe would hand it the
launch key (GET /v1/models carries it) and report it Ready. So before the first keyed request of
a generation, `check_listener` proves that every socket in LISTEN state that could take a
connection to the address we probe is held by a process of the server's process group, and
otherwise names the holder.

Linux: /proc/net/tcp and /proc/net/tcp6 list every socket of this network namespace with its
state, local address, owner uid and inode; /proc/<pid>/fd of the group's members shows which
inodes they hold (only our own processes are read). A foreign listener is named by pid and
program when this user may see its process (a scan of /proc/*/fd, on that failure path only),
else by its uid. Where /proc/net is missing (macOS, Windows), psutil's view of sockets is used:
every listener where the system lets us see them all, else only the group's own.
"""
from __future__ import annotations

import ipaddress
import os
import socket
import struct
from dataclasses import dataclass
from typing import Iterable, Optional, Union

import psutil

from ...errors.config_names import env_var
from ..logs import failures
from ..logs.failures import ServerFailure
from . import process_group

LISTEN = "0A"                    # the TCP state column of /proc/net/tcp for a listening socket
PROC_NET = ("/proc/net/tcp", "/proc/net/tcp6")
Address = Union[ipaddress.IPv4Address, ipaddress.IPv6Address]


@dataclass(frozen=True)
class Listener:
    """One listening socket: its local address, owner uid and inode (None where psutil gave it)."""

    address: str
    port: int
    uid: Optional[int]
    inode: Optional[int]
    pid: Optional[int] = None    # known from psutil, not from /proc/net


def _address(hex_text: str) -> str:
    """An address column of /proc/net/tcp{,6} (32-bit words in host byte order) as text."""
    words = [int(hex_text[i:i + 8], 16) for i in range(0, len(hex_text), 8)]
    family = socket.AF_INET if len(words) == 1 else socket.AF_INET6
    return socket.inet_ntop(family, struct.pack(f"={len(words)}I", *words))


def _proc_listeners(port: int) -> Optional[list[Listener]]:
    """The LISTEN sockets on `port` from /proc/net (None when it cannot be read)."""
    found: list[Listener] = []
    readable = False
    for path in PROC_NET:
        try:
            with open(path, encoding="ascii") as table:
                lines = table.read().splitlines()[1:]
        except OSError:
            continue
        readable = True
        for line in lines:
            cols = line.split()
            if len(cols) < 10 or cols[3] != LISTEN:
                continue
            hex_address, _, hex_port = cols[1].partition(":")
            if int(hex_port, 16) == port:
                found.append(Listener(_address(hex_address), port, int(cols[7]), int(cols[9])))
    return found if readable else None


def _psutil_listeners(port: int, pids: Iterable[int]) -> list[Listener]:
    """The LISTEN sockets on `port` psutil shows: all of them where allowed, else the given pids'."""
    try:
        conns = [(c.laddr, c.pid) for c in psutil.net_connections(kind="tcp")
                 if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port]
    except psutil.AccessDenied:
        conns = []
        for pid in pids:
            try:
                proc = psutil.Process(pid)
                listed = proc.net_connections(kind="tcp") if hasattr(proc, "net_connections") \
                    else proc.connections(kind="tcp")
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            conns += [(c.laddr, pid) for c in listed
                      if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port]
    return [Listener(addr.ip, port, None, None, pid) for addr, pid in conns]


def _targets(host: str) -> set[Address]:
    """The addresses a connection to `host` may go to."""
    try:
        return {ipaddress.ip_address(host.strip("[]"))}
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except OSError:
        return set()
    return {ipaddress.ip_address(info[4][0].split("%")[0]) for info in infos}


def _takes(listener: Listener, targets: set[Address]) -> bool:
    """Could `listener` accept a connection to one of `targets` (same port)? A wildcard takes its
    family's addresses (an IPv6 wildcard the IPv4 ones too, unless it is v6-only: counted anyway),
    an IPv4-mapped address its IPv4 one."""
    try:
        addr = ipaddress.ip_address(listener.address.split("%")[0])
    except ValueError:
        return True                   # unreadable: count it, the check then names it
    if addr.is_unspecified:
        return addr.version == 6 or any(t.version == 4 for t in targets)
    mapped = getattr(addr, "ipv4_mapped", None)
    return addr in targets or (mapped is not None and mapped in targets)


def socket_inodes(pid: int) -> set[int]:
    """The socket inodes process `pid` holds open (empty when it is gone or not ours to read)."""
    out: set[int] = set()
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return out
    for name in names:
        try:
            link = os.readlink(f"/proc/{pid}/fd/{name}")
        except OSError:
            continue
        if link.startswith("socket:["):
            out.add(int(link[8:-1]))
    return out


def _holder(inode: int) -> Optional[int]:
    """The pid of a process holding socket `inode`, among those this user may inspect."""
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and inode in socket_inodes(int(entry.name)):
            return int(entry.name)
    return None


def _program(pid: int) -> str:
    try:
        proc = psutil.Process(pid)
        words = proc.cmdline() or [proc.name()]
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return "?"
    text = " ".join(words)
    return text if len(text) <= 120 else text[:119] + "…"


def _describe(listener: Listener) -> str:
    pid = listener.pid if listener.pid is not None else (
        _holder(listener.inode) if listener.inode is not None else None)
    if pid is not None:
        return f"process {pid} ({_program(pid)})"
    if listener.uid is not None and hasattr(os, "getuid") and listener.uid != os.getuid():
        return f"a process of another user (uid {listener.uid})"
    return "a process this user cannot inspect"


def check_listener(host: str, port: int, pgid: int, known: frozenset[int] = frozenset()) -> frozenset[int]:
    """Prove that whatever listens on `port` for connections to `host` belongs to process group
    `pgid` before a keyed request goes there.

    Returns the listening sockets' inodes (`known`: inodes proved ours before, not looked up
    again; -1 for a socket known only through psutil); an empty set when nothing listens yet
    (ask again later; send nothing). Raises a
    ServerFailure (kind port_in_use, setting "port") naming the foreign holder otherwise."""
    targets = _targets(host)
    listeners = _proc_listeners(port)
    members: Optional[list[int]] = None
    if listeners is None:                                    # no /proc/net: psutil's view
        members = [p.pid for p in process_group.group_members(pgid)]
        listeners = _psutil_listeners(port, members)
    listeners = [entry for entry in listeners if _takes(entry, targets)]
    if not listeners:
        return frozenset()
    # psutil's sockets carry no inode: -1 stands for them (never cached, proved again each round)
    inodes = frozenset(entry.inode if entry.inode is not None else -1 for entry in listeners)
    if all(entry.inode is not None and entry.inode in known for entry in listeners):
        return inodes                                        # proved ours on an earlier round
    if members is None:
        members = [p.pid for p in process_group.group_members(pgid)]
    ours: set[int] = set()
    for pid in members:
        ours |= socket_inodes(pid)
    foreign = [entry for entry in listeners
               if (entry.pid not in members if entry.inode is None else entry.inode not in ours)]
    if foreign:
        raise listener_not_ours(host, port, _describe(foreign[0]))
    return inodes


def listener_not_ours(host: str, port: int, holder: str) -> ServerFailure:
    return ServerFailure(
        failures.PORT_IN_USE, f"Port {port} is held by another program, not by the server the launcher started",
        f"{holder} is listening on {host}:{port}, where the launcher's vLLM-Omni server was to answer. The launcher "
        "sent it nothing that needs the server's key (a launch key goes only to a listener in the server's own "
        "process group), stopped its own server and did not report it ready",
        f"stop that program, or set 'port' in the launcher config ({env_var('port')}) to a free port, or "
        "remove 'port' so a free one is picked for each launch", setting="port")
