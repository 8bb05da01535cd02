"""Windows: the package imports and its nodes register without POSIX-only attributes, and a Local
Server there explains that it needs Linux or WSL2 and points at Remote Server.

Most ComfyUI users run Windows, where vLLM-Omni does not run natively. Each check runs in a fresh
python whose `os` / `signal` lose what Windows lacks and whose `fcntl`, `resource`, `pwd`, `grp`,
`termios`, `pty` cannot be imported, so a top-level use of any of them fails the import here
as it would on Windows. The standard library and third-party modules are imported first, as
they would be on Windows (their own POSIX branches are not ours to test).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
NODE_IDS = {"VLLMOmniLoadModel", "VLLMOmniServingConfig", "VLLMOmniLocalServer", "VLLMOmniRemoteServer",
            "VLLMOmniGenerateVideo", "VLLMOmniStopServer", "VLLMOmniServerStatus", "VLLMOmniDoctor", "VLLMOmniLora",
            "VLLMOmniGenerateBatch", "VLLMOmniLoadPipelineModel", "VLLMOmniGenerateVACE",
            "VLLMOmniGenerateSpeechToVideo"}

WINDOWS_LIKE = textwrap.dedent("""
    import asyncio, concurrent.futures, http.client, json, logging, multiprocessing, os, pkgutil, platform
    import selectors, shlex, shutil, signal, socket, subprocess, sys, tempfile, threading, urllib.request, uuid
    import numpy, PIL.Image, requests
    for optional in ("av", "psutil", "pynvml"):
        try:
            __import__(optional)
        except ImportError:
            pass
    for name in ("setsid", "getsid", "setpgid", "setpgrp", "getpgrp", "getpgid", "killpg", "fork", "forkpty",
                 "getuid", "geteuid", "getgid", "getegid", "getgroups", "uname", "WNOHANG", "sync", "nice",
                 "sched_getaffinity", "pipe2", "O_CLOEXEC", "O_NONBLOCK"):
        if hasattr(os, name):
            delattr(os, name)
    for name in ("SIGKILL", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGALRM", "SIGCHLD", "SIGPIPE", "SIGSTOP",
                 "SIGCONT", "SIGTSTP", "pthread_kill", "pthread_sigmask", "setitimer", "alarm", "siginterrupt"):
        if hasattr(signal, name):
            delattr(signal, name)
    for name in ("fcntl", "resource", "pwd", "grp", "termios", "pty", "posix"):
        sys.modules[name] = None            # `import fcntl` now raises ImportError, as on Windows
""")


def _run(body: str, tmp_path: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_OMNI_LAUNCHER_")}
    env.update(VLLM_OMNI_LAUNCHER_CONFIG=str(tmp_path / "none.json"), VLLM_OMNI_LAUNCHER_DATA_DIR=str(tmp_path / "d"),
               XDG_DATA_HOME=str(tmp_path / "share"), PATH=os.defpath)
    script = WINDOWS_LIKE + textwrap.dedent(body)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=env,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_every_module_imports_and_the_nodes_register_without_posix(tmp_path):
    result = _run("""
        import vllm_omni_launcher as pkg
        failed, names = {}, []
        for info in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
            if info.name.endswith(".__main__"):
                continue                     # runs the CLI when imported; its imports are the cli package's
            names.append(info.name)
            try:
                __import__(info.name)
            except Exception as exc:
                failed[info.name] = f"{type(exc).__name__}: {exc}"
        try:
            from vllm_omni_launcher.nodes import NODES
            nodes, display = sorted(NODES), sorted(n.node_id for n in NODES.values() if n.display_name)
        except Exception as exc:
            nodes, display = [], []
            failed["NODES"] = f"{type(exc).__name__}: {exc}"
        print(json.dumps({"failed": failed, "names": names, "nodes": nodes, "display": display}))
    """, tmp_path)
    assert result["failed"] == {}
    assert {"vllm_omni_launcher.server.process.gpu_lock", "vllm_omni_launcher.server.process.process_group",
            "vllm_omni_launcher.server.supervision.supervisor", "vllm_omni_launcher.cli.setup_cmd"} <= set(result["names"])
    assert set(result["nodes"]) == NODE_IDS and set(result["display"]) == NODE_IDS


def test_local_server_on_windows_says_linux_or_wsl2_and_points_at_remote_server(tmp_path):
    result = _run("""
        from vllm_omni_launcher.errors import LauncherError
        from vllm_omni_launcher.nodes import NODES
        from vllm_omni_launcher.nodes.handles import ModelChoice, ServingChoice
        sys.platform = "win32"               # after the imports: what Windows reports
        try:
            NODES["VLLMOmniLocalServer"].call({"model": ModelChoice("Wan-AI/Wan2.2-TI2V-5B-Diffusers", "ti2v_5b"),
                                               "serving": ServingChoice(gpus="0")})
        except LauncherError as err:
            print(json.dumps({"what": err.what, "why": err.why, "fix": err.fix, "kind": err.kind}))
    """, tmp_path)
    assert "cannot run on Windows" in result["what"] and "WSL2" in result["why"] and "Linux" in result["why"]
    assert "Remote Server" in result["fix"] and "python -m vllm_omni_launcher setup" in result["fix"]
    assert result["kind"] == "platform"


def test_doctor_on_windows_reports_the_platform_instead_of_crashing(tmp_path):
    result = _run("""
        from vllm_omni_launcher.planner.doctor import run_doctor
        sys.platform = "win32"
        report = run_doctor(None, timeout_s=30)
        check = report.check("server_env")
        print(json.dumps({"status": check.status, "summary": check.summary, "fix": check.fix}))
    """, tmp_path)
    assert result["status"] == "problem" and "WSL2" in result["summary"] and "Remote Server" in result["fix"]
