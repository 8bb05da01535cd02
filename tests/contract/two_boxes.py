"""Two "machines" on this one: the head box (this machine's own network namespace) and a replica box
(a network namespace of its own), joined by a veth pair:

    head box: this namespace, voh<id> 10.231.N.1/24  <== veth ==>  eth0 10.231.N.2/24 in vomni-r<id>

The replica box has its own loopback, so nothing between the head and the replica can go over
127.0.0.1: the registration, the head's per-replica ports and the heartbeats all cross the veth.
A Supervisor runs on the replica box when it is started from a thread that entered that namespace
(`Boxes.run_in`): Linux keeps the network namespace per thread, and the threads and processes a
thread starts inherit it, so the server it spawns, its monitor thread (restarts, the head probe)
and every restart live on that box. The head, the test's own client and everything that reads
/proc/net (the launch key's listener check) stay in this namespace, as on a real head box.

Faults, without iptables (not installed everywhere), all on the replica box so that this machine's
own routing is never touched: `cut()` sets the head-side veth end down (a pulled cable: packets are
lost, nothing is refused); `block(ports)` adds policy-routing rules on the replica box that refuse
its outgoing TCP to those head ports (FIB rules match `dport`), as an egress firewall does.

`Boxes.make()` needs root and `ip`; it returns None and says why otherwise (the caller falls back
to loopback and reports that). Names carry the pid, so parallel test workers never collide.
"""
from __future__ import annotations

import ctypes
import os
import shutil
import socket
import struct
import subprocess
import threading
from typing import Any, Callable, Optional, Sequence, TypeVar, Union

from vllm_omni_launcher.server.process.port_owner import socket_inodes   # the launcher's own /proc/PID/fd reader

T = TypeVar("T")
CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=check)


class Boxes:
    """The head box (here) and the replica box (a namespace), and the faults between them."""

    def __init__(self, tag: int) -> None:
        net = 10 + tag % 240
        self.namespace = f"vomni-r{tag}"
        self.head_end = f"voh{tag}"                      # the veth end on the head box
        self.head_address = f"10.231.{net}.1"
        self.replica_address = f"10.231.{net}.2"
        self._rules: list[list[str]] = []

    # ---- setup and teardown ------------------------------------------------------------------
    @classmethod
    def make(cls) -> tuple[Optional["Boxes"], str]:
        """The two boxes, or (None, why not)."""
        if os.geteuid() != 0:
            return None, "not root: a network namespace needs CAP_SYS_ADMIN and CAP_NET_ADMIN"
        if shutil.which("ip") is None:
            return None, "the `ip` command (iproute2) is not installed"
        boxes = cls(os.getpid() % 100000)
        try:
            boxes._build()
        except (OSError, subprocess.SubprocessError) as exc:
            boxes.close()
            detail = getattr(exc, "stderr", "") or exc
            return None, f"`ip` could not build the replica box's namespace: {str(detail).strip()}"
        return boxes, ""

    def _build(self) -> None:
        self.close()                                       # what a killed earlier run of this pid left
        _ip("netns", "add", self.namespace)
        _ip("link", "add", self.head_end, "type", "veth", "peer", "name", "eth0", "netns", self.namespace)
        _ip("addr", "add", f"{self.head_address}/24", "dev", self.head_end)
        _ip("link", "set", self.head_end, "up")
        _ip("-n", self.namespace, "addr", "add", f"{self.replica_address}/24", "dev", "eth0")
        _ip("-n", self.namespace, "link", "set", "eth0", "up")
        _ip("-n", self.namespace, "link", "set", "lo", "up")

    def close(self) -> None:
        _ip("netns", "del", self.namespace, check=False)  # takes the veth pair along
        _ip("link", "del", self.head_end, check=False)

    # ---- running on the replica box ------------------------------------------------------------
    def run_in(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """fn(*args, **kwargs) on a thread inside the replica box's network namespace; its result or
        exception. Threads and processes fn starts stay in that namespace."""
        out: dict[str, Any] = {}

        def body() -> None:
            try:
                enter(self.namespace)
                out["value"] = fn(*args, **kwargs)
            except BaseException as exc:                   # noqa: BLE001 - handed to the caller
                out["error"] = exc
        thread = threading.Thread(target=body, name=f"on-{self.namespace}", daemon=True)
        thread.start()
        thread.join()
        if "error" in out:
            raise out["error"]
        return out["value"]

    # ---- faults ------------------------------------------------------------------------------
    def cut(self) -> None:
        """Pull the replica box's cable: the head-side veth end goes down (packets are lost: no RST)."""
        _ip("link", "set", self.head_end, "down")

    def mend(self) -> None:
        _ip("link", "set", self.head_end, "up")

    def block(self, ports: Sequence[Union[int, str]]) -> None:
        """Refuse the replica box's outgoing TCP to the head's `ports` (numbers or "LOW-HIGH" ranges)."""
        for dport in map(str, ports):
            rule = ["to", self.head_address, "ipproto", "tcp", "dport", dport, "prohibit"]
            _ip("-n", self.namespace, "rule", "add", *rule)
            self._rules.append(rule)

    def unblock(self) -> None:
        for rule in self._rules:
            _ip("-n", self.namespace, "rule", "del", *rule, check=False)
        self._rules.clear()


def enter(namespace: str) -> None:
    """Move the calling thread into the named network namespace (`ip netns` keeps them in /run/netns)."""
    fd = os.open(f"/run/netns/{namespace}", os.O_RDONLY | os.O_CLOEXEC)
    try:
        if _libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err), namespace)
    finally:
        os.close(fd)


ESTABLISHED, LISTEN = "01", "0A"           # the state column of /proc/net/tcp


def tcp_sockets(pids: Sequence[int], state: str) -> set[tuple[str, int, str, int]]:
    """(local ip, local port, remote ip, remote port) of the IPv4 TCP sockets in `state` that processes
    `pids` hold, each read from the process's own /proc/PID/net/tcp: that is its network namespace,
    where psutil would read the caller's."""
    out = set()
    for pid in pids:
        inodes = socket_inodes(pid)
        try:
            with open(f"/proc/{pid}/net/tcp", encoding="ascii") as table:
                rows = [line.split() for line in table.read().splitlines()[1:]]
        except OSError:
            continue                                   # the process is gone
        for cols in rows:
            if cols[3] == state and int(cols[9]) in inodes:
                (lip, lport), (rip, rport) = (_endpoint(cols[1]), _endpoint(cols[2]))
                out.add((lip, lport, rip, rport))
    return out


def _endpoint(text: str) -> tuple[str, int]:
    """`0100007F:1F90` (the address as a host-order 32-bit word) -> ("127.0.0.1", 8080)."""
    address, port = text.split(":")
    return socket.inet_ntoa(struct.pack("=I", int(address, 16))), int(port, 16)
