"""Who holds a `flock` on a file: the kernel's own list (/proc/locks), for the GPU lock's refusals.

A refused launcher names the holder. Its own user's holders also leave a record (gpu_lock.py);
another user's record is private to them, so for everyone the kernel's list is the source:
each line of /proc/locks gives a lock's type, the holder's pid and the locked file as
`MAJOR:MINOR:INODE` (major and minor in hex). Waiters (`->`) hold nothing and are skipped.
Some file systems (btrfs subvolumes, overlayfs) show a device there that `stat` does not: when
nothing matches device and inode, the inode alone is matched among flock locks. The owner of a
pid is read from /proc/<pid> (psutil), its command from its cmdline; a /proc mounted with
`hidepid` hides both, and the text says "another user" then.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable, Optional

import psutil

PROC_LOCKS = "/proc/locks"


def flock_pids(path: Path, writers_only: bool = False, table: Optional[Iterable[str]] = None) -> list[int]:
    """Pids holding a flock on `path` (`writers_only`: exclusive ones); empty when /proc/locks cannot tell."""
    try:
        st = os.stat(path)
        lines = list(table) if table is not None else Path(PROC_LOCKS).read_text().splitlines()
    except OSError:
        return []
    exact, by_inode = [], []
    for line in lines:
        parts = line.split()
        if len(parts) < 6 or parts[1] != "FLOCK" or (writers_only and parts[3] != "WRITE"):
            continue                     # a waiter ("->"), a POSIX lock, a reader, or a line we cannot read
        try:
            pid = int(parts[4])
            major, minor, inode = parts[5].split(":")
            dev = (int(major, 16), int(minor, 16))
            ino = int(inode)
        except ValueError:
            continue
        if ino != st.st_ino:
            continue
        (exact if dev == (os.major(st.st_dev), os.minor(st.st_dev)) else by_inode).append(pid)
    return sorted(set(exact or by_inode))


def owner(pid: int) -> Optional[tuple[int, str]]:
    """(uid, user name) of `pid`; None when /proc does not show it."""
    try:
        proc = psutil.Process(pid)
        uid = proc.uids().real
    except (psutil.Error, OSError):
        return None
    try:
        name = proc.username()
    except (psutil.Error, KeyError, OSError):
        name = f"uid {uid}"
    return uid, name
