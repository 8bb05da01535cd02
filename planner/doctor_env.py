"""The doctor's server-environment checks: run the server environment's python on a short script and
compare vllm / vllm-omni / torch / diffusers with the pins, and what torch sees of CUDA.

Apart from the machine checks (planner/doctor.py) because `setup` (cli/setup_cmd.py) runs the
same check on the environment it has just made; the python is found by the launcher's own
rule, so the doctor checks exactly the environment a launch would use.
"""
from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any, Callable, Optional

from ..errors import LauncherError
from ..server.config.local_config import LocalConfig
from ..server.config.server_env import SETUP_COMMAND, locate_server_program
from ..server.launch.versions import PINNED_RELEASE, SUPPORTED, server_python, supported_lines
from .doctor_report import OK, PROBLEM, UNCHECKED, WARNING, Check

# vllm major.minor -> the torch and diffusers it pins (docs/upstream-facts.md, "Version pins").
# One entry per supported line (server/launch/versions.py SUPPORTED).
PINS = {(0, 30): {"torch": "2.13", "diffusers": "0.40"}, (0, 26): {"torch": "2.11", "diffusers": "0.38"}}

_ENV_SCRIPT = r"""
import json, sys, platform
out = {"python": platform.python_version(), "executable": sys.executable}
try:
    from importlib import metadata
except ImportError:
    metadata = None
for dist in ("vllm", "vllm-omni", "torch", "diffusers", "transformers"):
    try:
        out[dist] = metadata.version(dist)
    except Exception:
        out[dist] = None
try:
    import torch
    out["torch_cuda"] = torch.version.cuda
    out["cuda_available"] = bool(torch.cuda.is_available())
    out["cuda_devices"] = torch.cuda.device_count() if out["cuda_available"] else 0
except Exception as exc:
    out["torch_error"] = repr(exc)[:300]
print("DOCTOR_JSON " + json.dumps(out))
"""


def _server_python(config: LocalConfig) -> tuple[Optional[str], str, str]:
    """The server environment's python, where it came from (or None and why), and the fix when None.

    The program is found by the launcher's own rule (server_env.locate_server_program), so the
    doctor checks exactly the environment a launch would use. A configured server_env whose
    bin/vllm is missing is still probed when it has a python: the report then says what it lacks."""
    if config.server_env and not config.server_command:
        env = Path(config.server_env).expanduser()
        found = next((env / "bin" / n for n in ("python", "python3") if (env / "bin" / n).exists()), None)
        if found is not None:
            return str(found), f"server_env {env}", ""
    try:
        program = locate_server_program(config.server_command, config.server_env)
    except LauncherError as exc:
        return None, exc.why or exc.what, exc.fix
    python = server_python(list(program.command))
    if python is None:
        return None, f"cannot find a python beside {program.command[0]} ({program.source})", (
            f"point 'server_env' at the venv holding vllm, or run `{SETUP_COMMAND}`")
    return python, program.source, ""


def major_minor(version: Optional[str]) -> Optional[tuple[int, int]]:
    """(major, minor) of a version string such as "0.30.0+cu128"; None when it has none."""
    if not version:
        return None
    parts = version.split("+")[0].split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return None


def check_server_env(config: LocalConfig, runner: Callable[..., Any], timeout_s: float,
                      machine_has_gpus: Optional[bool] = None) -> tuple[list[Check], dict[str, Any]]:
    """The checks "server_env" (vllm / vllm-omni / torch / diffusers pins) and "server_cuda" (what torch sees),
    and what the environment's python reported; also `setup`'s verdict on the environment it made."""
    python, where, fix = _server_python(config)
    if python is None:
        return [Check("server_env", UNCHECKED if "not on PATH" in where else PROBLEM,
                      f"server environment not checked: {where}", fix)], {}
    try:
        proc = runner([python, "-c", _ENV_SCRIPT], capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return [Check("server_env", PROBLEM, f"{python} did not answer within {timeout_s:.0f} s",
                      "check that the environment is not on a stalled network disk")], {}
    except OSError as exc:
        return [Check("server_env", PROBLEM, f"cannot run {python}: {exc}",
                      f"repair the server environment: `{SETUP_COMMAND}`")], {}
    line = next((ln for ln in (proc.stdout or "").splitlines() if ln.startswith("DOCTOR_JSON ")), None)
    if proc.returncode != 0 or line is None:
        tail = ((proc.stderr or "") + (proc.stdout or "")).strip()[-400:]
        return [Check("server_env", PROBLEM, f"{python} failed the version script",
                      f"repair the server environment: `{SETUP_COMMAND}`",
                      {"output": tail})], {}
    env = json.loads(line[len("DOCTOR_JSON "):])
    env["source"] = where
    checks: list[Check] = []
    vllm, omni = env.get("vllm"), env.get("vllm-omni")
    base = f"python {env.get('python')} ({where}); vllm {vllm}, vllm-omni {omni}, torch {env.get('torch')}"
    if not vllm or not omni:
        missing = " and ".join(n for n, v in (("vllm", vllm), ("vllm-omni", omni)) if not v)
        checks.append(Check("server_env", PROBLEM, f"{base}: {missing} not installed",
                            f"run `{SETUP_COMMAND}`, or in that environment pip install vllm=={PINNED_RELEASE} "
                            f"vllm-omni=={PINNED_RELEASE} (vllm-omni declares no vllm dependency)", env))
    else:
        vm, om = major_minor(vllm), major_minor(omni)
        if vm != om:
            checks.append(Check("server_env", PROBLEM, f"{base}: major.minor differ",
                                f"install the matching pair, e.g. pip install vllm=={omni} (upstream only warns "
                                "'mismatched major/minor versions' and then misbehaves)", env))
        elif om not in SUPPORTED:
            checks.append(Check("server_env", WARNING, f"{base}: {om[0]}.{om[1]} is not a version this launcher "
                                f"was checked against ({supported_lines()})",
                                f"use vllm-omni {PINNED_RELEASE} with vllm {PINNED_RELEASE}", env))
        else:
            pins = PINS[om]
            issues = []
            tmm = major_minor(env.get("torch"))
            if tmm and f"{tmm[0]}.{tmm[1]}" != pins["torch"]:
                issues.append(f"torch {env.get('torch')} but vllm {vllm} pins torch {pins['torch']}")
            dmm = major_minor(env.get("diffusers"))
            if dmm and f"{dmm[0]}.{dmm[1]}" != pins["diffusers"]:
                issues.append(f"diffusers {env.get('diffusers')} but vllm-omni {omni} pins {pins['diffusers']}")
            if issues:
                checks.append(Check("server_env", WARNING, base + ": " + "; ".join(issues),
                                    "reinstall with the pins: pip install vllm==%s vllm-omni==%s" % (vllm, omni), env))
            else:
                checks.append(Check("server_env", OK, base + ", versions match", details=env))
    if "torch_error" in env:
        checks.append(Check("server_cuda", PROBLEM, f"torch does not import in the server environment: "
                            f"{env['torch_error']}", "reinstall torch in the server environment", env))
    elif env.get("torch"):
        if env.get("cuda_available"):
            checks.append(Check("server_cuda", OK, f"torch sees CUDA {env.get('torch_cuda')} and "
                                f"{env.get('cuda_devices')} GPU(s)", details=env))
        elif not env.get("torch_cuda"):
            checks.append(Check("server_cuda", PROBLEM, f"torch {env.get('torch')} in the server environment is a "
                                "CPU-only build", "install the CUDA build of torch that vllm pins", env))
        elif machine_has_gpus is False:
            checks.append(Check("server_cuda", UNCHECKED, f"torch (CUDA {env.get('torch_cuda')}) sees no GPU, "
                                "and NVML found none (or could not run): CUDA could not be checked", details=env))
        else:
            checks.append(Check("server_cuda", PROBLEM,
                                f"torch (CUDA build {env.get('torch_cuda')}) sees no GPU from the server environment",
                                "a driver older than the CUDA build, or CUDA_VISIBLE_DEVICES hiding the GPUs: "
                                "update the driver or install the torch build for it", env))
    return checks, env
