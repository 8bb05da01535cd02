"""HTTP tries that another thread can stop at once, even in the middle of a blocked read.

`requests` cannot interrupt a read, and per-`recv` socket timeouts do not bound a server that
trickles a byte every few seconds. So the transport runs each try on a short-lived worker
thread (`run_try`) and waits in 0.1 s slices; to stop a try it shuts down the try's TCP
socket, which makes the worker's blocked `recv` return at once.

The sockets are found through our own urllib3 connection classes: `_Tracked._new_conn`
records the plain TCP socket as it is opened (below any TLS layer, so a handshake can be
stopped too), and `putrequest` reports it again when a kept-alive connection is reused.
`AbortableAdapter` makes a requests session use them, directly and through HTTP(S) proxies.
SOCKS proxies keep urllib3's own classes: a try through one is bounded by its socket
timeouts only.
"""
from __future__ import annotations

import socket
import threading
import time
from typing import Any, Callable, Generic, Optional, TypeVar

from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool
from urllib3.poolmanager import ProxyManager

T = TypeVar("T")

TICK_S = 0.1                   # how often the waiting caller checks for a reason to stop
ABORT_GRACE_S = 1.0            # how long a stopped try may take to notice its socket was shut
WORKER_NAME = "vllm-omni-http"

_current = threading.local()   # .attempt: the Attempt this worker thread runs


class Attempt(Generic[T]):
    """One try on a worker thread. `connected_at` / `headers_at` (time.monotonic) mark its
    progress for the caller's deadlines; the worker sets headers_at itself."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.connected_at: Optional[float] = None
        self.headers_at: Optional[float] = None
        self._done = threading.Event()
        self._result: Optional[T] = None
        self._error: Optional[BaseException] = None
        self._lock = threading.Lock()
        self._socks: list[socket.socket] = []
        self._aborted = False

    def _run(self, work: Callable[["Attempt[T]"], T]) -> None:
        _current.attempt = self
        try:
            self._result = work(self)
        except BaseException as exc:  # noqa: BLE001 - handed over to the caller's thread
            self._error = exc
        finally:
            _current.attempt = None
            self._done.set()

    def attach(self, sock: socket.socket) -> None:
        """Worker thread: the try's connection has this socket (new or reused)."""
        with self._lock:
            if sock not in self._socks:
                self._socks.append(sock)
            aborted = self._aborted
        if self.connected_at is None:
            self.connected_at = time.monotonic()
        if aborted:
            _shut(sock)
            raise ConnectionAbortedError("the launcher stopped this request")

    def abort(self) -> None:
        """Shut the try's sockets down: a recv blocked on the worker returns at once."""
        with self._lock:
            self._aborted = True
            socks = list(self._socks)
        for sock in socks:
            _shut(sock)


def run_try(work: Callable[[Attempt[T]], T], stop_reason: Callable[[Attempt[T]], Optional[BaseException]]) -> T:
    """Run work(attempt) on a worker thread and return its result (or raise its exception).

    Every TICK_S the caller asks stop_reason(attempt); an exception it returns (or one raised
    while waiting, e.g. KeyboardInterrupt) aborts the try and is raised here, after at most
    ABORT_GRACE_S for the worker to end."""
    attempt: Attempt[T] = Attempt()
    threading.Thread(target=attempt._run, args=(work,), name=WORKER_NAME, daemon=True).start()
    try:
        while not attempt._done.wait(TICK_S):
            reason = stop_reason(attempt)
            if reason is not None:
                raise reason
    except BaseException:
        attempt.abort()
        attempt._done.wait(ABORT_GRACE_S)
        raise
    if attempt._error is not None:
        raise attempt._error
    return attempt._result  # type: ignore[return-value]


def _shut(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def _attach_current(sock: Optional[socket.socket]) -> None:
    attempt = getattr(_current, "attempt", None)
    if attempt is not None and sock is not None:
        attempt.attach(sock)


class _Tracked:
    """Mixin for urllib3 connections: report the plain TCP socket to the running try."""

    _tcp_sock: Optional[socket.socket] = None

    def _new_conn(self) -> socket.socket:
        sock = super()._new_conn()  # type: ignore[misc]
        self._tcp_sock = sock
        _attach_current(sock)
        return sock

    def putrequest(self, *args: Any, **kwargs: Any) -> None:
        if getattr(self, "sock", None) is not None:   # a kept-alive connection being reused
            _attach_current(self._tcp_sock)
        super().putrequest(*args, **kwargs)  # type: ignore[misc]


class _TrackedHTTPConnection(_Tracked, HTTPConnection):
    pass


class _TrackedHTTPSConnection(_Tracked, HTTPSConnection):
    pass


class _TrackedHTTPPool(HTTPConnectionPool):
    ConnectionCls = _TrackedHTTPConnection


class _TrackedHTTPSPool(HTTPSConnectionPool):
    ConnectionCls = _TrackedHTTPSConnection


_TRACKED_POOLS = {"http": _TrackedHTTPPool, "https": _TrackedHTTPSPool}


class AbortableAdapter(HTTPAdapter):
    """requests adapter whose connections (direct and via an HTTP(S) proxy) run_try can stop."""

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = dict(_TRACKED_POOLS)

    def proxy_manager_for(self, proxy: str, **kwargs: Any) -> Any:
        manager = super().proxy_manager_for(proxy, **kwargs)
        if isinstance(manager, ProxyManager):
            manager.pool_classes_by_scheme = dict(_TRACKED_POOLS)
        return manager
