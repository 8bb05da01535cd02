"""The launch key goes only to a listener of our server's own process group (server/process/port_owner.py).

vLLM-Omni binds its port only once the model is loaded, so another local program can listen on it
first; the readiness probe's GET /v1/models carries the launch key. The "server" here is a fake
started by our Supervisor exactly as vLLM is (in its own process group, behind the watchdog); the
other program is this test process, listening on the configured port with a recorder that answers
/health and /v1/models as a real server would and keeps every request's headers.
"""
from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from hostile_server import HostileServer, answer
from vllm_omni_launcher.errors import LauncherError
from vllm_omni_launcher.server.logs import failures
from vllm_omni_launcher.server.process import port_owner, process_group
from vllm_omni_launcher.server.config.local_config import LocalConfig
from vllm_omni_launcher.server.launch.spec import LaunchSpec
from vllm_omni_launcher.server.supervision.supervisor import Supervisor

TI2V = "Wan-AI/Wan2.2-TI2V-5B-Diffusers"
# Prints its port and pgid, then either only waits (a server still loading) or serves /health and a
# keyed /v1/models itself on that port, as vLLM-Omni does once loaded.
FAKE = textwrap.dedent("""
    import http.server, json, os, sys, time
    argv = sys.argv
    port = int(argv[argv.index("--port") + 1])
    model = argv[argv.index("serve") + 1]
    print("FAKE_PORT=%d FAKE_PGID=%d" % (port, os.getpgid(0)), flush=True)
    if os.environ.get("FAKE_SERVES") != "1":
        while True:
            time.sleep(1)

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            if self.path == "/health":
                code, body = 200, {}
            elif self.headers.get("Authorization") == "Bearer " + os.environ.get("VLLM_API_KEY", ""):
                code, body = 200, {"object": "list", "data": [{"id": model}]}
            else:
                code, body = 401, {"error": "Unauthorized"}
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
""")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def config_for(data_dir: Path, port: int, **env: str) -> LocalConfig:
    return LocalConfig(server_command=(sys.executable, "-c", FAKE), data_dir=str(data_dir), port=port,
                       startup_timeout_s=120, extra_env=dict(env))


def wait_for_log(data_dir: Path, pattern: str, timeout: float = 60.0) -> re.Match[str]:
    """The first match of `pattern` in the server's log (waits for the line, polling the file)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for log in data_dir.glob("logs/*.log"):
            found = re.search(pattern, log.read_text(errors="replace"))
            if found:
                return found
        time.sleep(0.02)
    raise AssertionError(f"no {pattern!r} in the server log")


def test_another_program_on_the_port_never_gets_the_key_and_the_launch_names_it(tmp_path: Path) -> None:
    port = free_port()
    sup = Supervisor(LaunchSpec(model=TI2V, gpus=(0,)), config_for(tmp_path, port))
    squatter: list[HostileServer] = []
    started: list[int] = []

    def squat_once_spawned() -> None:
        found = wait_for_log(tmp_path, r"FAKE_PORT=(\d+) FAKE_PGID=(\d+)")
        started.append(int(found.group(2)))
        assert int(found.group(1)) == port
        squatter.append(HostileServer({("GET", "/health"): answer(200, {}),
                                       ("GET", "/v1/models"): answer(200, {"data": [{"id": TI2V}]})}, port=port))

    binder = threading.Thread(target=squat_once_spawned, daemon=True)
    binder.start()
    try:
        with pytest.raises(LauncherError) as info:
            sup.start()
        binder.join(5)
        err = info.value
        assert err.kind == failures.PORT_IN_USE and err.setting == "port"
        assert f"process {os.getpid()}" in err.why and "python" in err.why      # the holder, by pid and program
        assert f"Port {port} is held by another program" in err.what and "VLLM_OMNI_LAUNCHER_PORT" in err.fix
        (recorder,) = squatter
        assert recorder.calls("GET", "/health"), "it was probed (no key needed there)"
        assert recorder.calls("GET", "/v1/models") == []
        assert all("authorization" not in e.headers for e in recorder.log), "the key never reached it"
        assert process_group.group_members(started[0]) == [], "our own server was stopped"
        assert sup.status().phase == "failed" and not sup.status().ready
    finally:
        sup.stop()
        for server in squatter:
            server.close()


def test_our_own_listener_is_proved_once_and_gets_the_key(tmp_path: Path, monkeypatch) -> None:
    port = free_port()
    checks: list[frozenset[int]] = []
    real = port_owner.check_listener

    def counting(host, at, pgid, known=frozenset()):
        found = real(host, at, pgid, known)
        checks.append(known)
        return found
    monkeypatch.setattr(port_owner, "check_listener", counting)
    sup = Supervisor(LaunchSpec(model=TI2V, gpus=(0,)), config_for(tmp_path, port, FAKE_SERVES="1"))
    try:
        sup.start(timeout=60)
        assert sup.ready() and sup.url.endswith(f":{port}")
        assert checks and checks[0] == frozenset(), "checked before the first keyed request"
    finally:
        sup.stop()


def test_a_listener_proved_ours_is_not_looked_up_again(monkeypatch) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        me = os.getpgid(0)
        inodes = port_owner.check_listener("127.0.0.1", port, me)
        assert len(inodes) == 1
        with monkeypatch.context() as patched:
            patched.setattr(process_group, "group_members", lambda pgid: pytest.fail("looked up again"))
            assert port_owner.check_listener("127.0.0.1", port, me, inodes) == inodes
    assert port_owner.check_listener("127.0.0.1", port, me) == frozenset()        # nothing listens now


def test_a_listener_of_another_group_is_named_even_on_a_wildcard_bind() -> None:
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("0.0.0.0", 0))
            sock.listen()
            port = sock.getsockname()[1]
            with pytest.raises(failures.ServerFailure) as err:
                port_owner.check_listener("127.0.0.1", port, os.getpgid(other.pid))   # our socket, not its
            assert err.value.kind == failures.PORT_IN_USE and f"process {os.getpid()}" in err.value.why
            assert port_owner.check_listener("127.0.0.2", port, os.getpgid(0))      # 0.0.0.0 takes 127.0.0.2
    finally:
        other.kill()
        other.wait()


def test_without_proc_net_psutil_decides_the_same(monkeypatch) -> None:
    monkeypatch.setattr(port_owner, "PROC_NET", ("/nonexistent/tcp",))     # macOS, Windows: no /proc/net
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            sock.listen()
            port = sock.getsockname()[1]
            assert port_owner.check_listener("127.0.0.1", port, os.getpgid(0))     # ours: proved
            with pytest.raises(failures.ServerFailure) as err:
                port_owner.check_listener("127.0.0.1", port, os.getpgid(other.pid))
            assert f"process {os.getpid()}" in err.value.why
    finally:
        other.kill()
        other.wait()
