"""The launcher's own version, for `--version`."""
from __future__ import annotations

import re
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

DISTRIBUTION = "vllm-omni-launcher"
_PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


def package_version() -> str:
    """The installed distribution's version; for a clone run without `pip install`, pyproject's."""
    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:
        pass
    try:
        text = _PYPROJECT.read_text()
    except OSError:
        return "unknown"
    project = text.split("[project]", 1)[-1].split("\n[", 1)[0]     # only the [project] table
    found = re.search(r'(?m)^version\s*=\s*"([^"]+)"', project)
    return found.group(1) if found else "unknown"
