"""Parent-death watchdog for a launcher-started server: the server never outlives its owner.

ComfyUI has no shutdown hook for custom nodes, and atexit does not run when ComfyUI is
killed outright (SIGKILL, OOM killer, a crashed terminal). So the server is not started
directly: this small stdlib-only script is started instead, in a new session (it becomes
the process-group leader), and it starts the real server as its child in that same group.
Everything the server spawns (vLLM stage workers, multiprocessing helpers) inherits the
group, so one `killpg` reaches the whole tree.

The owner keeps the write end of a pipe whose read end only this script holds. When the
owner dies, however it dies, the kernel closes the write end and the read end reports
EOF; the script then stops the whole group (SIGTERM, a grace period, SIGKILL). As a second
trigger it polls its parent pid: if it was re-parented, the owner is gone even if a forked
helper of the owner still holds the pipe. A PR_SET_PDEATHSIG-based wrapper was rejected:
the signal fires when the *thread* that forked dies (the supervisor restarts servers from
its own threads) and it reaches only the direct child, not the server's workers.

Modes (argv after the script path):
  run   --fd N --owner-pid P [--grace S] -- PROGRAM ARGS...
        start PROGRAM in this group, exit with its exit code; on owner death stop the group.
  guard --fd N --owner-pid P --pgid G --leader-start T [--grace S]
        for a server adopted from an earlier owner (its original watchdog is gone): wait for
        the new owner's death and stop group G, or exit when G is empty.

Executed as a script by path (never imported as part of the package), so ComfyUI's
package `__init__` and its imports are not loaded into this process.
"""
from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from typing import Optional

POLL_S = 0.25
GRACE_S = 5.0   # SIGTERM-to-SIGKILL wait when --grace is missing; the same as timeouts.WATCHDOG_GRACE_S, which
                # the launcher always passes (this script runs by path and cannot import the package)
PREFIX = "[vllm-omni-launcher watchdog]"


def _say(text: str) -> None:
    try:
        sys.stderr.write(f"{PREFIX} {text}\n")
        sys.stderr.flush()
    except OSError:
        pass


def _stat_fields(pid: int) -> Optional[list[str]]:
    """Fields of /proc/PID/stat after the command name (state first); None if the process is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read().decode("latin-1")
    except OSError:
        return None
    return data[data.rfind(")") + 2:].split()


def _start_ticks(pid: int) -> Optional[int]:
    """Process start time in clock ticks since boot (field 22 of /proc/PID/stat); None if gone."""
    rest = _stat_fields(pid)
    return None if rest is None else int(rest[19])


def _pgrp(pid: int) -> Optional[int]:
    rest = _stat_fields(pid)
    if rest is None or rest[0] == "Z":       # zombies hold no memory; they only wait to be reaped
        return None
    return int(rest[2])


def group_members(pgid: int, exclude: int = -1) -> list[int]:
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            pid = int(name)
            if pid != exclude and _pgrp(pid) == pgid:
                out.append(pid)
    return out


def _group_is_ours(pgid: int, leader_start: Optional[int]) -> bool:
    """True when signalling group `pgid` can only reach the group we were told about.

    Linux keeps a pid reserved while any process still uses it as a process-group id, so
    while our group has members nobody else can become group `pgid`. If a process with pid
    `pgid` exists but started at another time, it is a stranger that reused the id after our
    group emptied: leave it alone.
    """
    if not group_members(pgid):
        return False
    start = _start_ticks(pgid)
    return start is None or leader_start is None or start == leader_start


def stop_group(pgid: int, grace_s: float, leader_start: Optional[int], exclude: int = -1) -> None:
    if not _group_is_ours(pgid, leader_start):
        return
    try:
        os.killpg(pgid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        return
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if not group_members(pgid, exclude=exclude):
            return
        time.sleep(0.1)
    if _group_is_ours(pgid, leader_start):
        try:
            os.killpg(pgid, signal.SIGKILL)   # reaches this script too when it is in the group
        except (ProcessLookupError, PermissionError):
            pass


def _owner_gone(fd: int, owner_pid: int, timeout: float) -> bool:
    """Wait up to `timeout`; True when the pipe hit EOF or we were re-parented."""
    if os.getppid() != owner_pid:
        return True
    try:
        readable, _, _ = select.select([fd], [], [], timeout)
    except InterruptedError:
        return False
    if readable:
        try:
            if os.read(fd, 4096) == b"":
                return True
        except OSError:
            return True
    return os.getppid() != owner_pid


def _parse(argv: list[str]) -> tuple[str, dict[str, str], list[str]]:
    mode, opts, rest = argv[0], {}, []
    i = 1
    while i < len(argv):
        if argv[i] == "--":
            rest = argv[i + 1:]
            break
        opts[argv[i].lstrip("-")] = argv[i + 1]
        i += 2
    return mode, opts, rest


def _noop(signum: int, frame: object) -> None:  # Python handlers reset to default on exec
    pass


def run(opts: dict[str, str], program: list[str]) -> int:
    fd, owner, grace = int(opts["fd"]), int(opts["owner-pid"]), float(opts.get("grace", GRACE_S))
    me = os.getpid()
    # The supervisor signals the whole group to stop the server; this script stays to
    # report the server's exit code instead of dying first.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _noop)
    try:
        child = subprocess.Popen(program, close_fds=True)
    except OSError as exc:
        _say(f"cannot start {program[0]!r}: {exc}")
        return 127
    while True:
        code = child.poll()
        if code is not None:
            return 128 - code if code < 0 else code
        if _owner_gone(fd, owner, POLL_S):
            _say(f"owner process {owner} is gone; stopping server process group {me}")
            stop_group(me, grace, None, exclude=me)
            code = child.poll()
            return 0 if code is None else (128 - code if code < 0 else code)


def guard(opts: dict[str, str]) -> int:
    fd, owner, grace = int(opts["fd"]), int(opts["owner-pid"]), float(opts.get("grace", GRACE_S))
    pgid = int(opts["pgid"])
    leader_start = int(opts["leader-start"]) if opts.get("leader-start", "") not in ("", "none") else None
    while True:
        if not group_members(pgid):
            return 0
        if _owner_gone(fd, owner, POLL_S * 2):
            _say(f"owner process {owner} is gone; stopping adopted server process group {pgid}")
            stop_group(pgid, grace, leader_start)
            return 0


def main(argv: list[str]) -> int:
    mode, opts, rest = _parse(argv)
    if mode == "run":
        return run(opts, rest)
    if mode == "guard":
        return guard(opts)
    _say(f"unknown mode {mode!r}")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
