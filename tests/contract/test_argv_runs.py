"""Issue done-when: the argv printed by `argv --json`, run under the stub server (real vLLM-Omni
0.30 CLI + HTTP layer), reaches /health 200 and serves the model behind the API key."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import requests

from stubserver import STUB_SCRIPT, server_python

T2V = "Wan-AI/Wan2.2-T2V-A14B-Diffusers"


def test_printed_argv_starts_a_server_that_becomes_healthy():
    out = subprocess.run([sys.executable, "-m", "vllm_omni_launcher", "argv", "--model", T2V, "--gpus", "0,1",
                          "--parallel", "ulysses=2", "--json"], capture_output=True, text=True, check=True)
    shown = json.loads(out.stdout)
    argv, env = shown["argv"], shown["env"]
    assert argv[0] == "vllm" and env["VLLM_API_KEY"] == "***"
    port = int(argv[argv.index("--port") + 1])
    env = {**os.environ, **env, "VLLM_API_KEY": "real-key"}       # the launcher puts a fresh key here
    proc = subprocess.Popen([server_python(), str(STUB_SCRIPT), *argv[1:]], env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 600
        healthy = False
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                healthy = requests.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200
            except requests.ConnectionError:
                healthy = False
            if healthy:
                break
            time.sleep(0.2)
        assert healthy, proc.stderr.read() if proc.poll() is not None else "not healthy in time"
        models = requests.get(f"http://127.0.0.1:{port}/v1/models", timeout=5,
                              headers={"Authorization": "Bearer real-key"}).json()
        assert models["data"][0]["id"] == T2V
        assert requests.get(f"http://127.0.0.1:{port}/v1/models", timeout=5).status_code == 401
    finally:
        os.killpg(proc.pid, 9)
        proc.wait(30)
