"""Start the server in its own process group behind the watchdog, and stop that whole group.

vLLM-Omni spawns stage workers (one per GPU) that hold the GPU memory; signalling only the
`vllm` pid can leave them running. Every process of one server shares one process group,
created by the watchdog (`watchdog.py`, the group leader), so stopping means: SIGINT to the
group (vLLM's graceful shutdown), then SIGTERM, then SIGKILL, each with a timeout, and
finally a psutil scan proving no member is left. We only ever signal a group after checking
it is still ours (leader pid and create time, see `owns_group`), never a bare pid.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

import psutil

from . import timeouts

WATCHDOG_SCRIPT = str(Path(__file__).with_name("watchdog.py"))


@dataclass
class ServerProcess:
    """One running server: the watchdog (group leader) and the real server under it.

    `popen` is set when this process started it; an adopted server (left behind by an
    earlier ComfyUI) has none, and liveness comes from psutil with the recorded create time.
    """

    pgid: int                           # == watchdog pid (group leader)
    leader_create_time: Optional[float]
    server_pid: Optional[int] = None
    server_create_time: Optional[float] = None
    popen: Optional[subprocess.Popen] = None
    owner_fd: Optional[int] = None      # our end of the watchdog pipe; closing it stops the group
    guard: Optional[subprocess.Popen] = None   # watchdog guarding an adopted server
    adopted: bool = False
    exit_code: Optional[int] = field(default=None)

    # ---- liveness -------------------------------------------------------------------
    def poll(self) -> Optional[int]:
        """None while the server runs; else its exit code (-1 when unknown, e.g. adopted)."""
        if self.exit_code is not None:
            return self.exit_code
        if self.popen is not None:
            code = self.popen.poll()
            if code is None and self.server_pid is not None \
                    and not _same_process(self.server_pid, self.server_create_time):
                # The server died; the watchdog reports its exit code within its poll period.
                try:
                    code = self.popen.wait(timeout=timeouts.WATCHDOG_EXIT_S)
                except subprocess.TimeoutExpired:
                    return None
            self.exit_code = code
            return code
        if _same_process(self.server_pid, self.server_create_time):
            return None
        self.exit_code = -1
        return self.exit_code

    def alive(self) -> bool:
        return self.poll() is None

    def members(self) -> list[psutil.Process]:
        return group_members(self.pgid) if owns_group(self.pgid, self.leader_create_time) else []

    # ---- stopping -------------------------------------------------------------------
    def stop(self, timeout: float = timeouts.STOP_S, graceful: bool = True) -> list[int]:
        """Stop the whole group; returns pids still alive afterwards (empty on success)."""
        steps: list[tuple[int, float]] = []
        if graceful:
            steps += [(signal.SIGINT, timeout * 0.5), (signal.SIGTERM, timeout * 0.3)]
        else:
            steps += [(signal.SIGTERM, min(3.0, timeout * 0.5))]
        steps.append((signal.SIGKILL, max(3.0, timeout * 0.2)))
        for sig, wait_s in steps:
            if not self._signal(sig):
                break
            if self._wait_empty(wait_s):
                break
        self._reap()
        self.close_owner_fd()
        if self.guard is not None:
            _terminate_quietly(self.guard)
            self.guard = None
        left = [p.pid for p in self.members()]
        return left

    def _signal(self, sig: int) -> bool:
        """Signal the group if it is still ours and not empty; False when nothing is left."""
        if not owns_group(self.pgid, self.leader_create_time):
            return False
        if not group_members(self.pgid):
            return False
        try:
            os.killpg(self.pgid, sig)
        except ProcessLookupError:
            return False
        return True

    def _wait_empty(self, seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while True:
            self._reap()
            if not group_members(self.pgid):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)

    def _reap(self) -> None:
        if self.popen is not None and self.exit_code is None:
            code = self.popen.poll()
            if code is not None:
                self.exit_code = code

    def close_owner_fd(self) -> None:
        if self.owner_fd is not None:
            try:
                os.close(self.owner_fd)
            except OSError:
                pass
            self.owner_fd = None


# ---- helpers ------------------------------------------------------------------------
def _same_process(pid: Optional[int], create_time: Optional[float]) -> bool:
    if pid is None:
        return False
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        return create_time is None or abs(proc.create_time() - create_time) < 0.05
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def create_time(pid: int) -> Optional[float]:
    try:
        return psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def group_members(pgid: int) -> list[psutil.Process]:
    """Live (non-zombie) processes whose process group is `pgid`."""
    out = []
    for proc in psutil.process_iter(["status"]):
        try:
            if proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            if os.getpgid(proc.pid) == pgid:
                out.append(proc)
        except (ProcessLookupError, psutil.NoSuchProcess, PermissionError):
            continue
    return out


def owns_group(pgid: int, leader_create_time: Optional[float]) -> bool:
    """True when group `pgid` is still the one we created (see watchdog._group_is_ours).

    While the group has members its id cannot be reused, so the only stranger case is a
    new process with pid == pgid that started after our group emptied: its create time
    differs from our leader's.
    """
    try:
        leader = psutil.Process(pgid)
        if leader.status() != psutil.STATUS_ZOMBIE and leader_create_time is not None \
                and abs(leader.create_time() - leader_create_time) >= 0.05:
            return False
    except psutil.NoSuchProcess:
        pass
    except psutil.AccessDenied:
        return False
    return True


def _terminate_quietly(proc: subprocess.Popen) -> None:
    try:
        proc.terminate()
        proc.wait(timeout=timeouts.GUARD_EXIT_S)
    except (OSError, subprocess.TimeoutExpired):
        try:
            proc.kill()
            proc.wait(timeout=timeouts.GUARD_EXIT_S)
        except (OSError, subprocess.TimeoutExpired):
            pass


def spawn(argv: Sequence[str], env: dict[str, str], log_fd: int, cwd: Optional[str] = None,
          grace_s: float = timeouts.WATCHDOG_GRACE_S) -> ServerProcess:
    """Start `argv` under the watchdog in a new session; stdout+stderr append to `log_fd`."""
    read_fd, write_fd = os.pipe()         # both non-inheritable; only read_fd is passed on
    try:
        wrapper = [sys.executable, "-u", WATCHDOG_SCRIPT, "run", "--fd", str(read_fd),
                   "--owner-pid", str(os.getpid()), "--grace", str(grace_s), "--", *argv]
        popen = subprocess.Popen(wrapper, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=log_fd,
                                 stderr=log_fd, start_new_session=True, pass_fds=(read_fd,), close_fds=True)
    except BaseException:
        os.close(write_fd)
        raise
    finally:
        os.close(read_fd)
    proc = ServerProcess(pgid=popen.pid, leader_create_time=create_time(popen.pid), popen=popen,
                         owner_fd=write_fd)
    return proc


def find_server_child(proc: ServerProcess, timeout: float = timeouts.FIND_SERVER_CHILD_S,
                      should_stop: Callable[[], bool] = lambda: False) -> None:
    """Record the real server's pid (the watchdog's child) and its create time."""
    if proc.popen is None:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.popen.poll() is None and not should_stop():
        try:
            children = psutil.Process(proc.popen.pid).children()
        except psutil.NoSuchProcess:
            return
        if children:
            proc.server_pid = children[0].pid
            proc.server_create_time = create_time(children[0].pid)
            return
        time.sleep(0.005)


def guard_adopted(proc: ServerProcess, grace_s: float = timeouts.WATCHDOG_GRACE_S) -> None:
    """Bind an adopted server's life to this process with a watchdog in guard mode."""
    read_fd, write_fd = os.pipe()
    leader_start = _start_ticks(proc.pgid) if psutil.pid_exists(proc.pgid) else None
    try:
        proc.guard = subprocess.Popen(
            [sys.executable, "-u", WATCHDOG_SCRIPT, "guard", "--fd", str(read_fd), "--owner-pid", str(os.getpid()),
             "--pgid", str(proc.pgid), "--leader-start", str(leader_start) if leader_start is not None else "none",
             "--grace", str(grace_s)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True, pass_fds=(read_fd,), close_fds=True)
    except BaseException:
        os.close(write_fd)
        raise
    finally:
        os.close(read_fd)
    proc.owner_fd = write_fd


def _start_ticks(pid: int) -> Optional[int]:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read().decode("latin-1")
        return int(data[data.rfind(")") + 2:].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def cmdline(pid: int) -> Optional[list[str]]:
    try:
        return list(psutil.Process(pid).cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def verify_cmdline(pid: int, expected: Sequence[str]) -> bool:
    """True when `pid` runs exactly the argv we launched (proves it is our server)."""
    return cmdline(pid) == list(expected)
