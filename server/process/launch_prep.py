"""Everything a launch needs before a process runs: program, port, key, environment, storage.

Each step here can refuse with a LauncherError that says what to change, and none of them
starts anything, so a refused launch leaves nothing behind. The order matters: the program
is checked before any file is touched, and the caller takes the GPU lock (gpu_lock.py)
between `server_program` and `prepare`, so a launch that another process's server blocks
never waits for a port or wipes job storage.
"""
from __future__ import annotations

import os
import secrets
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Union

from ..config.environment import server_environment
from ..config.local_config import LocalConfig
from ..launch.hf_cache import require_wan_vae_config
from ..launch.spec import LaunchCommand, LaunchSpec
from ..logs import failures
from ..storage import compile_cache, private_files
from . import gpu_lock, probe, timeouts

KeyMode = Union[bool, str]       # True: a fresh key per launch; False: none; a string: that key
ShouldStop = Callable[[], bool]

STORAGE_ENV = "VLLM_OMNI_SERVER_STORAGE__PATH"   # vLLM-Omni's job storage folder (MP4s of finished jobs)


@dataclass(frozen=True)
class Launch:
    """One prepared launch. Holds the key: never logged, repr'd or put in argv."""

    spec: LaunchSpec
    command: LaunchCommand
    port: int
    storage: Path
    api_key: Optional[str] = field(default=None, repr=False)
    env: dict[str, str] = field(default_factory=dict, repr=False)


def server_program(config: LocalConfig) -> list[str]:
    """The `vllm` command from the local config, checked to be runnable."""
    executable = config.resolved_server_command()
    program = executable[0]
    if os.sep in program:
        if not (os.path.isfile(program) and os.access(program, os.X_OK)):
            raise failures.executable_missing(program, "the file does not exist or is not executable")
    elif shutil.which(program) is None:
        raise failures.executable_missing(program, "it is not on PATH")
    return executable


def gpu_targets(spec: LaunchSpec, config: LocalConfig) -> gpu_lock.Gpus:
    """The GPUs the server will see (what the GPU lock must cover)."""
    return gpu_lock.targets(spec.gpus, server_environment(os.environ, config, {}))


def prepare(spec: LaunchSpec, config: LocalConfig, executable: list[str], data_dir: str, key_mode: KeyMode,
            preferred_port: Optional[int], should_stop: ShouldStop) -> Launch:
    """Port, key, argv, environment and a fresh storage folder for one launch of `spec`."""
    port = choose_port(spec.host, spec.port or config.port, preferred_port, should_stop)
    key: Optional[str] = secrets.token_urlsafe(32) if key_mode is True else (key_mode or None)
    command = spec.build(executable, port, key, trust_remote_code=config.trust_remote_code)
    # A new server cannot serve the old jobs' files: wipe its folder. storage/ is checked first (a real
    # folder of ours: through a linked one the wipe would empty another program's folder); rmtree never
    # follows a link at the folder itself, and private_dir then refuses one there.
    # The environment first: a refused compile cache then leaves the old jobs' files alone.
    storage = private_files.private_dir(data_dir, "storage") / spec.fingerprint()
    env = server_environment(os.environ, config, {**command.env, STORAGE_ENV: str(storage), "PYTHONUNBUFFERED": "1"},
                             compile_cache=lambda: compile_cache.compile_cache_dir(data_dir))
    require_wan_vae_config(spec.model, spec.family, env)      # an offline S2V server needs a cached file
    shutil.rmtree(storage, ignore_errors=True)
    private_files.private_dir(data_dir, "storage", spec.fingerprint())
    return Launch(spec, command, port, storage, api_key=key, env=env)


def choose_port(host: str, configured: Optional[int], preferred: Optional[int], should_stop: ShouldStop) -> int:
    """The configured port (it must be free), else the port of the previous generation (a
    restart keeps its URL: nodes hold it in their handles), else a free one."""
    if configured:
        if not wait_port_free(host, configured, timeouts.PORT_RELEASE_S if preferred == configured else 0.0,
                              should_stop):
            raise failures.port_taken(configured)
        return configured
    if preferred and wait_port_free(host, preferred, timeouts.PORT_RELEASE_S, should_stop):
        return preferred
    return probe.free_port(host)


def wait_port_free(host: str, port: int, seconds: float, should_stop: ShouldStop) -> bool:
    """A killed server's listening socket is closed by the kernel a moment after the process
    is gone (deferred file release), so give the old port a few seconds before giving it up."""
    deadline = time.monotonic() + seconds
    while True:
        if probe.port_available(host, port):
            return True
        if time.monotonic() >= deadline or should_stop():
            return False
        time.sleep(0.1)
