"""Named stub servers shared by many contract tests (the ``stub_pool`` fixture of tests/contract/conftest.py):
how to start each (`StubConfig`) and the pool that starts one on first use, stops it between leases and
ends them all at the end of the session (`StubPool`). One stub alone is stubserver.py's `run_stub`.
"""
from __future__ import annotations

import contextlib
import signal
import threading
from dataclasses import dataclass, field
from typing import Callable, Iterator, Mapping

from stubserver import StubServer, run_stub


@dataclass(frozen=True)
class StubConfig:
    """How to start one shared stub (the arguments of :func:`run_stub`)."""

    model: str
    env: Mapping[str, str] = field(default_factory=dict)
    flags: tuple[str, ...] = ()
    separate_stderr: bool = False

    @classmethod
    def from_argv(cls, argv: list[str], env: Mapping[str, str]) -> "StubConfig":
        """The stub started with exactly ``argv`` (``vllm serve MODEL ...``, as the launcher's
        ``argv --json`` prints it; the stub script stands in for ``vllm``) under ``env``."""
        if argv[1:2] != ["serve"] or len(argv) < 3:
            raise ValueError(f"not a `vllm serve MODEL ...` command line: {argv}")
        return cls(argv[2], env=dict(env), flags=tuple(argv[3:]))


class StubPool:
    """Named stub servers shared by many tests: each starts on first use and stays up.

    A test takes shared stubs for a while with ``with pool.lease(NAME, ...) as stubs:``; a
    shared stub runs only while someone holds a lease on it and is stopped (SIGSTOP to its
    process group) in between, because an idle vLLM-Omni server still costs about a tenth
    of a core (its orchestrator polls every millisecond): kept running, three shared stubs
    would burn what they save.  A stopped stub resumes where it was (a job still denoising
    goes on), as on a machine that was busy for a while.

    A test takes a shared stub only where its requests leave the server as it found it
    (any job it starts ends or is deleted); one that needs the process itself (its exit,
    a crash, a hang) starts its own with :func:`run_stub`, or ends a shared one through
    :meth:`retire`, after which the next lease starts a fresh one.  Thread-safe: the lock
    is only held to spawn, stop and resume, so stubs leased together start together.
    """

    def __init__(self, configs: Mapping[str, StubConfig | Callable[[], StubConfig]],
                 health_timeout: float = 900.0) -> None:
        self.configs = dict(configs)
        self.health_timeout = health_timeout
        self._lock = threading.Lock()
        self._running: dict[str, tuple[StubServer, contextlib.ExitStack]] = {}
        self._leases: dict[str, int] = {}

    @contextlib.contextmanager
    def lease(self, *names: str) -> Iterator[list[StubServer]]:
        """The healthy stubs of ``names`` (in that order), started if need be, running until
        the block exits."""
        with self._lock:
            for name in names:
                if name not in self._running:
                    cfg = self.configs[name]
                    cfg = cfg() if callable(cfg) else cfg    # a factory: made when the stub starts
                    stack = contextlib.ExitStack()
                    server = stack.enter_context(run_stub(cfg.model, flags=cfg.flags, env=cfg.env,
                                                          separate_stderr=cfg.separate_stderr))
                    self._running[name] = (server, stack)
                if not self._leases.get(name):
                    self._running[name][0].signal_group(signal.SIGCONT)
                self._leases[name] = self._leases.get(name, 0) + 1
            servers = [self._running[name][0] for name in names]
        try:
            for name, server in zip(names, servers):
                if server.proc.poll() is not None:
                    # never restarted silently: a shared stub that died took other tests' state with it
                    raise RuntimeError(f"shared stub {name!r} exited with code {server.proc.returncode}; "
                                       f"log tail:\n{server.output_text()[-6000:]}")
                server.wait_healthy(self.health_timeout)
            yield servers
        finally:
            with self._lock:
                for name, server in zip(names, servers):
                    self._leases[name] -= 1
                    if not self._leases[name] and self._running.get(name, (None,))[0] is server:
                        server.signal_group(signal.SIGSTOP)

    @contextlib.contextmanager
    def retire(self, name: str) -> Iterator[StubServer]:
        """Take stub ``name`` out of the pool (started if need be) for a test that ends it;
        its process group is killed and its log removed when the block exits."""
        with self.lease(name) as (server,):
            with self._lock:
                _, stack = self._running.pop(name)
        with stack:
            yield server

    def close(self) -> None:
        """End every stub of the pool: SIGTERM to all process groups at once, so their
        shutdowns overlap, then each one's :meth:`StubServer.kill_group`."""
        with self._lock:
            running, self._running = self._running, {}
        for server, _ in running.values():
            server.signal_group(signal.SIGCONT)   # a stopped process acts on SIGTERM only once resumed
            server.signal_group(signal.SIGTERM)
        for _, stack in running.values():
            stack.close()

