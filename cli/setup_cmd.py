"""`setup`: create, repair or upgrade the server environment to the pinned vllm / vllm-omni pair, then check it.

Installing is always this explicit command, run by the user in a terminal on the GPU machine
(inside WSL2 on Windows): never from a node, never when ComfyUI starts. Where: `--path`, else
the configured `server_env`, else the default location the launcher finds by itself
(server/config/server_env.py). The work is server/create_server_env.sh (uv when present, whose own
progress shows on stderr); this command decides whether it is needed (an environment that
already has the wanted pair and an importing torch is left alone), runs it, then checks the
result as the doctor does: the pair (server/launch/versions.py), torch, and the GPUs torch sees. No
GPU is a warning, not a failure: a CPU box can build the environment for a GPU box.

Results (what it did, where, the versions, the GPUs, what to run next) go to stdout; phases
and the installer's output go to stderr.
"""
from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Optional

from ..errors import LauncherError
from ..planner.doctor_env import check_server_env
from ..planner.doctor_report import OK
from ..planner.gpus import query_gpus
from ..server.config.local_config import LocalConfig, load_local_config, setting_env_var
from ..server.config.platform_check import require_local_server_platform
from ..server.config.server_env import PACKAGE, SETUP_COMMAND, SETUP_SCRIPT, default_server_env
from ..server.launch.versions import PINNED_RELEASE, ServerVersions
from .exit_codes import ExitCode

CREATE_SCRIPT = SETUP_SCRIPT                      # the installer run (tests put a stand-in here)
CHECK_TIMEOUT_S = 180.0                           # importing torch + vllm metadata on a cold disk


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--path", default=None, metavar="DIR",
                        help=f"where the server environment is (default: the configured server_env, else "
                             f"{default_server_env()}, which the launcher finds by itself)")
    parser.add_argument("--version", default=PINNED_RELEASE, metavar="X.Y.Z",
                        help=f"vllm and vllm-omni version, both the same (default: the pinned {PINNED_RELEASE})")
    parser.add_argument("--python", default=None, metavar="PY",
                        help="interpreter for a new environment (default: python3.12 if present, else python3)")


@dataclass(frozen=True)
class SetupResult:
    """What `setup` did and what the environment holds afterwards (`env`: the doctor's version report)."""

    target: Path
    action: str                      # "already ready", "created", "repaired", "upgraded from ..."
    env: dict[str, Any]
    gpu_note: str                    # what torch sees, or why that is only a warning
    gpu_ok: bool


def installer_argv(target: Path, version: str, python: Optional[str], script: Path = CREATE_SCRIPT) -> list[str]:
    """The create_server_env.sh command line (run by bash: a zip install may lose the executable bit)."""
    argv = ["bash", str(script), str(target), "--version", version]
    return argv + (["--python", python] if python else [])


def inspect_env(target: Path, config: LocalConfig, runner: Callable[..., Any] = subprocess.run,
                timeout_s: float = CHECK_TIMEOUT_S) -> tuple[Optional[dict[str, Any]], list[Any]]:
    """The doctor's report on the environment at `target` (None when it has no python yet) and its checks."""
    if not any((target / "bin" / name).exists() for name in ("python", "python3")):
        return None, []
    probe = replace(config, server_command=(), server_env=str(target))
    gpus, _why = query_gpus()
    checks, env = check_server_env(probe, runner, timeout_s, machine_has_gpus=bool(gpus))
    return (env or None), checks


def _ready(env: Optional[dict[str, Any]], version: str) -> bool:
    return bool(env) and env.get("vllm") == version and env.get("vllm-omni") == version and "torch_error" not in env


def _action(env: Optional[dict[str, Any]], target: Path) -> str:
    if env is None:
        return "repaired (its python did not run)" if target.exists() and any(target.iterdir()) else "created"
    if env.get("vllm") or env.get("vllm-omni"):
        return f"upgraded from vllm {env.get('vllm')} / vllm-omni {env.get('vllm-omni')}"
    return "repaired (vllm / vllm-omni were missing)"


def _say(text: str) -> None:
    print(f"[setup] {text}", file=sys.stderr, flush=True)


def run_setup(target: Path, version: str, python: Optional[str], config: LocalConfig, *,
              script: Path = CREATE_SCRIPT, runner: Callable[..., Any] = subprocess.run) -> SetupResult:
    """Bring `target` to vllm==version + vllm-omni==version (running `script` only when needed), then check it.

    `script` and `runner` are the seams tests use (a tiny installer; the doctor's subprocess runner)."""
    require_local_server_platform()
    _say(f"checking the server environment at {target}")
    after, checks = inspect_env(target, config, runner)
    if _ready(after, version):
        action = "already ready"
        _say(f"it already has vllm {version} and vllm-omni {version}; nothing to install")
    else:
        action = _action(after, target)
        argv = installer_argv(target, version, python, script)
        _say(f"installing vllm=={version} + vllm-omni=={version} (this downloads several GB the first time): "
             f"{shlex.join(argv)}")
        proc = subprocess.run(argv, stdout=2, check=False)   # its output is progress: our stderr (fd 2), live
        if proc.returncode != 0:
            raise LauncherError(
                f"Setting up the server environment at {target} failed", f"the installer exited with code "
                f"{proc.returncode}; its output is above", "fix what it reports (network, disk space, another "
                f"interpreter via --python), then run `{SETUP_COMMAND}` again: it repairs what is there",
                setting="server_env", kind="setup")
        _say("checking the result: the vllm / vllm-omni pair, torch and the GPUs it sees")
        after, checks = inspect_env(target, config, runner)
    if after is None:
        raise LauncherError(f"The server environment at {target} has no working python after setup",
                            "the installer finished but left no bin/python", f"run `{SETUP_COMMAND}` again, "
                            "or delete the folder and run it again", setting="server_env", kind="setup")
    ServerVersions(after.get("python", ""), after.get("vllm"), after.get("vllm-omni")).check()
    if not _ready(after, version):
        problem = next((c for c in checks if c.status != OK), None)
        raise LauncherError(
            f"The server environment at {target} is not ready after setup",
            f"it has vllm {after.get('vllm')}, vllm-omni {after.get('vllm-omni')}, torch {after.get('torch')}"
            + (f": {problem.summary}" if problem else ""), f"run `{SETUP_COMMAND} --version {version}` again",
            setting="server_env", kind="setup", raw=after.get("torch_error", ""))
    cuda = next((c for c in checks if c.name == "server_cuda"), None)
    devices = int(after.get("cuda_devices") or 0)
    if cuda is not None and cuda.status == OK:
        note = f"torch.cuda.device_count() = {devices} (CUDA {after.get('torch_cuda')})"
    else:
        note = (f"torch.cuda.device_count() = {devices}: " + (cuda.summary if cuda else "torch reported nothing")
                + (f"; {cuda.fix}" if cuda and cuda.fix else "") + " (fine for a CPU machine; a GPU box needs it)")
    return SetupResult(target, action, after, note, cuda is not None and cuda.status == OK)


def _next_step(target: Path, config: LocalConfig) -> list[str]:
    """How the launcher will find `target`, given what is configured (explicit settings win)."""
    if config.server_command:
        found = (f"warning: server_command ({shlex.join(config.server_command)}) is configured and wins over any "
                 f"server environment; remove {setting_env_var('server_command')} / 'server_command' to use this "
                 "one")
    elif config.server_env and Path(config.server_env).expanduser().absolute() == target:
        found = "the launcher uses it: it is the configured server_env"
    elif config.server_env:
        found = (f"warning: server_env is configured as {config.server_env} and wins; set "
                 f"{setting_env_var('server_env')} / 'server_env' to {target} to use this one")
    elif target == default_server_env().absolute():
        found = "the launcher finds it here by itself: nothing to configure"
    else:
        found = (f"point the launcher at it: export {setting_env_var('server_env')}={target} (or \"server_env\" in the "
                 "launcher config) before starting ComfyUI")
    # the CLI runs as `<python> -m vllm_omni_launcher`: name that interpreter, as setup_command does
    return [found, f"next: open a template in ComfyUI, or {shlex.quote(sys.executable or 'python3')} -m {PACKAGE} "
                   'generate --prompt "a red fox running through snow"']


def run(args: argparse.Namespace) -> int:
    config = load_local_config()
    target = Path(args.path or config.server_env or default_server_env()).expanduser().absolute()
    result = run_setup(target, args.version, args.python, config, script=CREATE_SCRIPT)
    env = result.env
    print(f"server environment {result.action}: {result.target}")
    print(f"  python {env.get('python')}, vllm {env.get('vllm')} + vllm-omni {env.get('vllm-omni')}, "
          f"torch {env.get('torch')}, diffusers {env.get('diffusers')}")
    print(f"  {'GPUs' if result.gpu_ok else 'warning'}: {result.gpu_note}")
    for line in _next_step(result.target, config):
        print(f"  {line}")
    return ExitCode.OK
