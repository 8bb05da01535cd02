"""Shared test setup: helper modules on sys.path, and no test touches the user's config or data."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS / "contract"))  # frame_code, stubserver


@pytest.fixture(autouse=True)
def _isolated_launcher_dirs(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    base = tmp_path_factory.getbasetemp()
    monkeypatch.setenv("VLLM_OMNI_LAUNCHER_CONFIG", str(base / "no-config.json"))
    monkeypatch.setenv("VLLM_OMNI_LAUNCHER_DATA_DIR", str(base / "launcher-data"))
    for key in list(os.environ):
        if key.startswith("VLLM_OMNI_STUB_"):
            monkeypatch.delenv(key)
