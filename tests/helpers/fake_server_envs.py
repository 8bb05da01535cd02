"""Server environments that only report a vllm / vllm-omni pair: the version check's fakes.

The check runs the environment's interpreter with `-c` and reads the JSON it prints; run as the
server, the fake leaves a mark (`started`) and exits 1, so a test can tell that nothing started."""
from __future__ import annotations

import json
import stat
from pathlib import Path
from typing import Optional


def fake_server_env(tmp_path: Path, vllm: str, omni: Optional[str]) -> Path:
    """A server environment whose interpreter reports these versions; run as the server, it leaves a mark."""
    root = tmp_path / f"env-{vllm}-{omni}"
    root.mkdir()
    python = root / "python"
    report = json.dumps({"python": "3.12.0", "vllm": vllm, "vllm-omni": omni})
    python.write_text(f"#!/bin/sh\nif [ \"$1\" = -c ]; then echo '{report}'; exit 0; fi\n"
                      f"touch {root / 'started'}\nexit 1\n")
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    return root


def server_command(root: Path) -> str:
    """The launcher's server command for the fake environment at `root`."""
    return f"{root / 'python'} {root / 'server.py'}"
