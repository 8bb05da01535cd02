"""Start the stub vLLM-Omni server (``stub_vllm_serve.py``) from tests. No pytest needed.

The stub is the real vLLM-Omni 0.30 server (CLI, config resolution, FastAPI app) with a
fake GPU; see the docstring of ``stub_vllm_serve.py`` for its fault knobs
(``VLLM_OMNI_STUB_*`` environment variables).  It runs under the *server* python, named by
``VLLM_OMNI_LAUNCHER_TEST_SERVER_PYTHON`` (the venv with vllm + vllm-omni); the tests
themselves run under the ComfyUI python, which has neither.

Typical use::

    from stubserver import run_stub

    with run_stub("Wan-AI/Wan2.2-T2V-A14B-Diffusers", flags=["--usp", "2"],
                  env={"CUDA_VISIBLE_DEVICES": "0,1"}) as stub:
        stub.wait_healthy()
        requests.get(stub.url + "/v1/models")
        ...
        assert "Model loading took" in stub.stderr_text()

``run_stub`` starts ``<server python> stub_vllm_serve.py serve MODEL --omni --host H
--port P [flags]`` in its own process group (new session), with stdout and stderr going to
one log file (``2>&1``: upstream's logger writes to stdout, tqdm and tracebacks to stderr),
and kills the whole group when the ``with`` block ends.  Startup takes as long as
importing vllm + vllm-omni (tens of seconds on a small CI machine), so tests that do not
need a fresh process share one: stub_pool.py's ``StubPool`` starts named configurations on first
use and keeps them for every later user (``tests/contract/conftest.py`` holds the
session's pool), and :class:`Resolver` keeps one resolver process for all batches.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import select
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping

ENV_VAR = "VLLM_OMNI_LAUNCHER_TEST_SERVER_PYTHON"
HERE = Path(__file__).resolve().parent
STUB_SCRIPT = str(HERE / "stub_vllm_serve.py")
RESOLVE_SCRIPT = str(HERE / "upstream_resolve.py")

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def server_python() -> str:
    """Path of the server python (``$VLLM_OMNI_LAUNCHER_TEST_SERVER_PYTHON``); raises if unusable."""
    path = os.environ.get(ENV_VAR, "").strip()
    if not path:
        raise RuntimeError(
            f"{ENV_VAR} is not set. Point it at the python of the server venv that has "
            "vllm==0.30.0 and vllm-omni==0.30.0 (CI: <repo>/.venv-server/bin/python)."
        )
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        raise RuntimeError(f"{ENV_VAR}={path!r} is not an executable file.")
    return path


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free right now (bind to 0 and release)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def strip_ansi(text: str) -> str:
    return _ANSI.sub("", text)


class StubServer:
    """Handle on one running stub process (see :func:`run_stub`)."""

    def __init__(self, proc: subprocess.Popen, host: str, port: int, log_path: str, argv: list[str],
                 stdout_path: str | None = None, env: Mapping[str, str | None] | None = None) -> None:
        self.proc = proc
        self.host = host
        self.port = port
        self.url = f"http://{host}:{port}"
        self.log_path = log_path          # stderr (and stdout too unless separate_stderr)
        self.stdout_path = stdout_path    # only with run_stub(separate_stderr=True)
        self.argv = argv
        self.env = dict(env or {})        # what run_stub's ``env`` added to / removed from os.environ

    # -- output ------------------------------------------------------------------------
    @staticmethod
    def _read(path: str | None, raw: bool) -> str:
        if path is None:
            return ""
        try:
            data = Path(path).read_bytes().decode("utf-8", "replace")
        except FileNotFoundError:
            return ""
        return data if raw else strip_ansi(data)

    def stderr_text(self, raw: bool = False) -> str:
        """What the process wrote so far: stdout and stderr interleaved (like ``2>&1``), or
        stderr alone when started with ``separate_stderr=True``.

        ANSI colour codes (upstream forces coloured prefixes) are removed unless ``raw``.
        """
        return self._read(self.log_path, raw)

    def stdout_text(self, raw: bool = False) -> str:
        """stdout alone (upstream's log lines); empty unless ``separate_stderr=True``."""
        return self._read(self.stdout_path, raw)

    def output_text(self, raw: bool = False) -> str:
        """Everything written so far (stdout + stderr)."""
        return self.stderr_text(raw) + self.stdout_text(raw)

    def stub_pid(self) -> int | None:
        """The pid the stub printed as ``STUB_PID=<pid>`` (the server process)."""
        m = re.search(r"STUB_PID=(\d+)", self.stderr_text())
        return int(m.group(1)) if m else None

    # -- state -------------------------------------------------------------------------
    def alive(self) -> bool:
        return self.proc.poll() is None

    def health(self, timeout: float = 2.0) -> int | None:
        """HTTP status of ``GET /health``, or None when nothing answers in time."""
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=timeout) as r:
                return r.status
        except urllib.error.HTTPError as e:
            return e.code
        except (OSError, urllib.error.URLError):
            return None

    def wait_healthy(self, timeout: float = 300.0) -> None:
        """Block until ``/health`` answers 200; raise if the process exits or time runs out."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                raise RuntimeError(
                    f"stub exited with code {self.proc.returncode} before becoming healthy; "
                    f"log tail:\n{self.output_text()[-6000:]}")
            if self.health(timeout=2.0) == 200:
                return
            time.sleep(0.25)
        raise TimeoutError(f"stub not healthy after {timeout}s; log tail:\n{self.output_text()[-6000:]}")

    def wait_exit(self, timeout: float = 300.0) -> int:
        """Wait for the process to exit by itself; returns its exit code."""
        return self.proc.wait(timeout=timeout)

    def wait_for_text(self, needle: str, timeout: float = 300.0, since: int = 0) -> str:
        """Wait until ``needle`` appears in the (ANSI-stripped) output from offset ``since``
        on (a shared stub's log holds earlier tests' lines too); returns the whole output."""
        deadline = time.monotonic() + timeout
        while True:
            text = self.output_text()
            if needle in text[since:]:
                return text
            if not self.alive() or time.monotonic() > deadline:
                raise AssertionError(f"{needle!r} not in stub output (alive={self.alive()}); "
                                     f"tail:\n{text[-6000:]}")
            time.sleep(0.1)

    # -- teardown ----------------------------------------------------------------------
    def signal_group(self, sig: int) -> None:
        """Send ``sig`` to the process group (the stub leads its own session) if the stub runs."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, sig)

    def kill_group(self, grace: float = 5.0) -> None:
        """SIGTERM the process group, wait ``grace`` seconds, then SIGKILL the group."""
        pgid = self.proc.pid  # leader of its own session/group (start_new_session=True)
        if self.proc.poll() is None:
            self.signal_group(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=grace)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.1) -> Any:
    """Poll `predicate` until it returns something true (returned), or fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for: {what}")
        time.sleep(interval)


def stub_command(model: str, flags: Iterable[str] = (), host: str = "127.0.0.1", port: int | None = None) -> list[str]:
    """The argv ``run_stub`` executes (``--omni``/``--host``/``--port`` added unless in ``flags``)."""
    flags = [str(f) for f in flags]
    present = {f.split("=", 1)[0] for f in flags}
    argv = [server_python(), STUB_SCRIPT, "serve", model]
    if "--omni" not in present:
        argv.append("--omni")
    if "--host" not in present:
        argv += ["--host", host]
    if "--port" not in present:
        argv += ["--port", str(port if port is not None else free_port(host))]
    return argv + flags


@contextlib.contextmanager
def run_stub(
    model: str,
    flags: Iterable[str] = (),
    env: Mapping[str, str | None] | None = None,
    port: int | None = None,
    host: str = "127.0.0.1",
    kill_grace: float = 5.0,
    separate_stderr: bool = False,
) -> Iterator[StubServer]:
    """Start the stub in its own process group; kill the group when the block exits.

    ``env`` adds to / overrides ``os.environ`` (a value of ``None`` removes the variable),
    e.g. ``{"CUDA_VISIBLE_DEVICES": "0,1", "VLLM_OMNI_STUB_STEP_S": "0.05"}``.
    Output goes to one log (``2>&1``) unless ``separate_stderr`` (then see ``stdout_text``).
    Teardown: SIGTERM to the group, ``kill_grace`` seconds, then SIGKILL to the group.
    """
    port = port if port is not None else free_port(host)
    argv = stub_command(model, flags, host=host, port=port)
    for i, a in enumerate(argv):
        if a == "--port" and i + 1 < len(argv):
            port = int(argv[i + 1])
        elif a.startswith("--port="):
            port = int(a.split("=", 1)[1])
    child_env = dict(os.environ)
    child_env.setdefault("PYTHONUNBUFFERED", "1")
    for key, value in (env or {}).items():
        if value is None:
            child_env.pop(key, None)
        else:
            child_env[key] = str(value)
    fd, log_path = tempfile.mkstemp(prefix="vllm-omni-stub-", suffix=".log")
    out_fd, stdout_path = (tempfile.mkstemp(prefix="vllm-omni-stub-", suffix=".stdout.log")
                           if separate_stderr else (None, None))
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out_fd if separate_stderr else fd,
                                stderr=fd if separate_stderr else subprocess.STDOUT,
                                env=child_env, start_new_session=True)
    except BaseException:
        for f, path in ((fd, log_path), (out_fd, stdout_path)):
            if f is not None:
                os.close(f)
                os.unlink(path)
        raise
    os.close(fd)
    if out_fd is not None:
        os.close(out_fd)
    server = StubServer(proc, host, port, log_path, argv, stdout_path=stdout_path, env=env)
    try:
        yield server
    finally:
        server.kill_group(grace=kill_grace)
        for path in (log_path, stdout_path):
            if path is not None:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)



class Resolver:
    """One long-lived ``upstream_resolve.py --serve`` process: vLLM is imported once, not per batch.

    ``with Resolver() as r: r.resolve(cases)``; the process starts on the first batch and
    ends with the block (or :meth:`close`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None

    def __enter__(self) -> "Resolver":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def resolve(self, cases: list[dict], timeout: float = 900.0) -> list[dict]:
        """What the real vLLM-Omni resolves for ``cases`` (see ``upstream_resolve.py``), one result per case."""
        with self._lock:
            if self._proc is None or self._proc.poll() is not None:
                self._proc = subprocess.Popen([server_python(), RESOLVE_SCRIPT, "--serve"], stdin=subprocess.PIPE,
                                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                              start_new_session=True)
            proc = self._proc
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.write(json.dumps(cases).encode() + b"\n")
            proc.stdin.flush()
            line = b""
            deadline = time.monotonic() + timeout
            while not line.endswith(b"\n"):
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([proc.stdout], [], [], left)[0]:
                    self._kill()
                    raise TimeoutError(f"upstream_resolve.py gave no answer within {timeout:.0f} s")
                chunk = os.read(proc.stdout.fileno(), 1 << 20)
                if not chunk:
                    code = proc.wait(timeout=30)
                    self._proc = None
                    raise RuntimeError(f"upstream_resolve.py exited ({code}) before answering "
                                       "(run it by hand with --verbose to see why)")
                line += chunk
            return json.loads(line)

    def _kill(self) -> None:
        if self._proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self._proc.pid, signal.SIGKILL)
            self._proc.wait(timeout=30)
            self._proc = None

    def close(self) -> None:
        """End the resolver: it exits when its stdin closes."""
        with self._lock:
            if self._proc is None:
                return
            assert self._proc.stdin is not None
            with contextlib.suppress(OSError):
                self._proc.stdin.close()
            try:
                self._proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._kill()
            self._proc = None
