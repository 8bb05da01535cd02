"""Shared test setup: helper modules on sys.path, no test touches the user's config or data,
the fixtures several test files use (``server_env_python`` for tests outside ``tests/contract``
that need vLLM, ``hostile`` servers of our own, one ``noisy_mp4`` clip), and the xdist
scheduling that keeps tests sharing a server process in one worker and sends the longest first
(``xdist_groups.py``; tests/run.sh runs ``-n 2 --dist loadgroup``).

Helpers shared by several test files live in ``tests/helpers/`` (and the stub's own modules in
``tests/contract/``), never in a test file: a test module imports no other test module."""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Callable, Iterator

import pytest

TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS / "contract"))  # frame_code, stubserver
sys.path.insert(0, str(TESTS / "helpers"))   # clips, hostile_server, hostile_jobs, processes, ...

import hostile_server  # noqa: E402
import stubserver  # noqa: E402
import xdist_groups  # noqa: E402

from vllm_omni_launcher.planner.launch_plan import GPU_MEMORY_ENV  # noqa: E402
from vllm_omni_launcher.server.config import local_config  # noqa: E402

# Settings a developer may have exported change what the planner sees (GPU sizes) or where the
# launcher binds and what it runs: dropped once, when the session starts, so a test (or a
# module-scoped fixture that sets them for its module's tests) that wants one sets it itself.
for _key in (GPU_MEMORY_ENV, *(f"VLLM_OMNI_LAUNCHER_{name}" for name in ("PORT", "HOST", "SERVER_CMD",
                                                                         "SERVER_ENV"))):
    os.environ.pop(_key, None)

SERVER_ENV_MISSING = (
    f"needs the server environment (vllm + vllm-omni): {stubserver.ENV_VAR} is not set; "
    "point it at that venv's python (bash tests/run.sh builds .venv-server and sets it)")


@pytest.fixture(scope="session")
def server_env_python() -> str:
    """The server python, for a test outside tests/contract that runs vLLM (a stub server, the
    server env's version check).  Unset: the test is skipped, saying so, so that ``tests/unit``
    runs without the server environment; set to something that is not a python: it fails.
    tests/run.sh always sets it, so nothing is skipped there."""
    if not os.environ.get(stubserver.ENV_VAR, "").strip():
        pytest.skip(SERVER_ENV_MISSING)
    return stubserver.server_python()


@pytest.fixture(autouse=True)
def _isolated_launcher_dirs(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    base = tmp_path_factory.getbasetemp()
    monkeypatch.setenv("VLLM_OMNI_LAUNCHER_CONFIG", str(base / "no-config.json"))
    monkeypatch.setenv("VLLM_OMNI_LAUNCHER_DATA_DIR", str(base / "launcher-data"))
    # The GPU lock is machine-wide (/tmp/vllm-omni-launcher-gpu-locks): each test gets its own, so that
    # xdist workers' stub servers on "GPU 0" never meet, nor the developer's own ComfyUI. The variable
    # reaches launcher subprocesses; the default covers configs a test builds without the setting.
    locks = str(tmp_path_factory.mktemp("gpu-locks"))
    monkeypatch.setenv("VLLM_OMNI_LAUNCHER_GPU_LOCK_DIR", locks)
    monkeypatch.setattr(local_config, "default_gpu_lock_dir", lambda: locks)
    # The default server environment lives under XDG_DATA_HOME: one made by `setup` on a developer's
    # machine must not turn the "cannot find the server program" tests into something else.
    monkeypatch.setenv("XDG_DATA_HOME", str(base / "xdg-data"))
    for key in list(os.environ):
        if key.startswith("VLLM_OMNI_STUB_"):
            monkeypatch.delenv(key)
    # Every server-python script a test runs (lora_loader_check.py, ...) imports vLLM; without
    # this, humming (a kernel package vLLM imports) spends 8 CPU-s of each on two background
    # CUDA builds that fail on a machine without CUDA (tests/contract/upstream.py explains it
    # and sets it for the stub and the resolver, whose environment the launcher filters).
    monkeypatch.setenv("HUMMING_DISABLE_PARALLEL_BUILD", "1")


@pytest.fixture
def hostile() -> Iterator[Callable[[dict], hostile_server.HostileServer]]:
    """Start hostile servers of our own (hostile_server.py) from their routes; closed after the test."""
    servers: list[hostile_server.HostileServer] = []

    def start(routes: dict) -> hostile_server.HostileServer:
        servers.append(hostile_server.HostileServer(routes))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


@pytest.fixture(scope="session")
def noisy_mp4() -> bytes:
    """clips.noisy_clip(): its index after the data, as upstream writes it, and large enough that a
    streamed download fetches its tail."""
    import clips                                           # PyAV: only for the tests that use it
    from vllm_omni_launcher.client import streamed_download

    data = clips.noisy_clip()
    assert data.index(b"mdat") < data.index(b"moov")
    assert len(data) >= streamed_download.TAIL_MIN_BYTES
    return data


def pytest_configure(config: pytest.Config) -> None:
    xdist_groups.configure(config)


@pytest.hookimpl(trylast=True)    # after tests/contract/conftest.py has marked the xdist groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    xdist_groups.order_by_cost(config, items)


@pytest.hookimpl(tryfirst=True)   # before xdist's worker reports that collection finished
def pytest_collection_finish(session: pytest.Session) -> None:
    xdist_groups.write_groups(session)


@pytest.hookimpl(optionalhook=True)   # a hook of pytest-xdist, which a plain run need not have
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    return xdist_groups.make_scheduler(config, log)
