"""One small JSON file per running server, so a restarted ComfyUI can find what it left.

The watchdog stops a server when its owner dies, but a server can still be left behind
(the watchdog itself was killed, a crash between two steps). The state file records what
is needed to prove a process is that server before touching it (pid, process group, the
create times, the exact argv) and to reuse it (port, spec fingerprint, API key, log path).

The API key of a server is stored here so an adopted server stays usable. The file is
created 0600 inside a 0700 directory (never through a link: private_files.py), written
atomically, and deleted when the server stops; anyone who can read it could also read the
server's /proc environment.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

from . import private_files

VERSION = 1
MAX_BYTES = 1 << 20                # a state file is a few KiB; a larger one is not ours


@dataclass
class ServerState:
    pgid: int
    leader_create_time: Optional[float]
    server_pid: Optional[int]
    server_create_time: Optional[float]
    argv: list[str]
    host: str
    port: int
    fingerprint: str                  # the spec the server runs
    requested_fingerprint: str        # the spec that was asked for (differs after an OOM fallback)
    spec: dict[str, Any]
    api_key: Optional[str] = field(default=None, repr=False)
    log_path: str = ""
    storage_path: str = ""
    owner_pid: int = 0
    owner_create_time: Optional[float] = None
    started_at: float = 0.0
    ready: bool = False
    version: int = VERSION

    def __repr__(self) -> str:
        return (f"ServerState(pgid={self.pgid}, server_pid={self.server_pid}, port={self.port}, "
                f"fingerprint={self.fingerprint})")


def state_dir(data_dir: str) -> Path:
    return private_files.private_dir(data_dir, "state")


def path_for(data_dir: str, pgid: int) -> Path:
    return state_dir(data_dir) / f"server-{pgid}.json"


def write(data_dir: str, state: ServerState) -> Path:
    """Write atomically with 0600 permissions (the file holds the API key), never through a link."""
    target = path_for(data_dir, state.pgid)
    with private_files.replacing(target) as out:
        out.write(json.dumps(asdict(state)).encode())
    return target


def remove(data_dir: str, pgid: int) -> None:
    try:
        path_for(data_dir, pgid).unlink()
    except FileNotFoundError:
        pass


def read(path: Path) -> Optional[ServerState]:
    """The state in `path`; None for anything we did not write (a link, another owner, a mode
    open to others: never trust it) or cannot parse."""
    raw = private_files.read_private(path, MAX_BYTES)
    if raw is None:
        return None
    try:
        data = json.loads(raw)
        if not isinstance(data, dict) or data.get("version") != VERSION:
            return None
        return ServerState(**data)
    except (ValueError, TypeError):
        return None


def read_all(data_dir: str) -> list[tuple[Path, Optional[ServerState]]]:
    directory = state_dir(data_dir)
    return [(p, read(p)) for p in sorted(directory.glob("server-*.json"))]
