"""The compile cache of the servers the launcher starts: a folder under the data dir that only we can write.

The cache holds what torch.compile made for the server (inductor's FX and AOT graphs, the
generated Python and the Triton kernels under `triton/`), and the next server loads and runs
it. A folder someone else can write is therefore code injection into the server. So unlike
the data dir's other folders, which private_files tightens to 0700 when it finds them too
open, this one is refused when it is a link, not ours, or writable by group or others:
tightening it would keep whatever was put there. A folder we make is 0700 from the start.

When the server gets this folder (and when the user's own setting wins) is the server
environment's rule: server/config/environment.py.
"""
from __future__ import annotations

import os
import stat
from pathlib import Path

from ..config.environment import INDUCTOR_CACHE
from . import private_files

FOLDER = "torch_compile_cache"


def compile_cache_dir(data_dir: str) -> Path:
    """`data_dir/torch_compile_cache`, made 0700 when absent; a DataDirError when others could have written it."""
    path = private_files.private_dir(data_dir) / FOLDER
    try:
        _refuse_unsafe(path, os.lstat(path))
    except FileNotFoundError:
        pass                                     # made below, 0700
    return private_files.private_dir(data_dir, FOLDER)


def _refuse_unsafe(path: Path, st: os.stat_result) -> None:
    """Refuse `path` unless it is a real folder of ours that no one else can write (even for root)."""
    fix = (f"remove it (`rm -rf {path}`; the launcher makes a fresh private one and the next server "
           f"compiles again), or set {INDUCTOR_CACHE} in the launcher config's extra_env to a folder of your own")
    me = private_files.euid()
    if stat.S_ISLNK(st.st_mode):
        why = "it is a symbolic link, so wherever it points would become the server's code"
    elif not stat.S_ISDIR(st.st_mode):
        why = "it is not a folder"
    elif st.st_uid != me:
        why = f"it belongs to uid {st.st_uid}, not to you (uid {me}), so its owner could run code in your server"
    elif st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        who = " and ".join(w for w, bit in (("group", stat.S_IWGRP), ("others", stat.S_IWOTH)) if st.st_mode & bit)
        why = (f"it is writable by {who} (mode {stat.S_IMODE(st.st_mode):04o}), so anyone who could write there "
               "could run code in your server; the launcher does not tighten such a folder, since what is already "
               "in it could have been put there")
    else:
        return
    raise private_files.refused(path, "it is the torch.compile cache of the servers the launcher starts, and a "
                                f"server loads and runs the compiled code it finds there; {why}", fix)
