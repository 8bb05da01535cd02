"""Contract-test fixtures: the session's shared server processes.

* ``stub_pool``: one :class:`stubserver.StubPool` (the stubs of ``shared_stubs.py``), each
  stub started when a test first asks for it;
* ``upstream_resolver``: one :class:`stubserver.Resolver` (vLLM's parser and config
  resolution in one long-lived process).

Each is ended right after the last test of the session that uses it (directly or through
another fixture), and the modules that use one run one after the other (their order
otherwise unchanged), so these processes never sit idle while the rest of the suite runs:
an idle stub still costs about a tenth of a core (upstream's orchestrator polls every
millisecond) and a gigabyte of memory.  Under pytest-xdist each worker has its own.
"""
from __future__ import annotations

from typing import Callable, Iterator, Optional

import pytest

import shared_stubs
import stubserver

SHARED = ("stub_pool", "upstream_resolver")   # session fixtures that own a process
_CLOSE: dict[str, Callable[[], None]] = {}    # the open ones: fixture name -> close


@pytest.fixture(scope="session")
def stub_pool() -> Iterator[stubserver.StubPool]:
    stubserver.server_python()  # a missing server python fails every test that needs a stub, loudly
    pool = stubserver.StubPool(shared_stubs.CONFIGS)
    _CLOSE["stub_pool"] = pool.close
    try:
        yield pool
    finally:
        _CLOSE.pop("stub_pool", None)
        pool.close()


@pytest.fixture(scope="session")
def upstream_resolver() -> Iterator[stubserver.Resolver]:
    stubserver.server_python()
    with stubserver.Resolver() as resolver:
        _CLOSE["upstream_resolver"] = resolver.close
        try:
            yield resolver
        finally:
            _CLOSE.pop("upstream_resolver", None)


def _uses(item: pytest.Item, name: str) -> bool:
    return name in getattr(item, "fixturenames", ())


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Move the modules that use a shared process next to the first one that does."""
    for name in SHARED:
        modules = {item.path for item in items if _uses(item, name)}
        first = next((i for i, item in enumerate(items) if item.path in modules), None)
        if first is None:
            continue
        tail = items[first:]
        items[first:] = [i for i in tail if i.path in modules] + [i for i in tail if i.path not in modules]


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: Optional[pytest.Item]) -> None:
    """End a shared process as soon as no later test of this session uses it."""
    items = item.session.items
    later = items[items.index(item) + 1:] if item in items else []
    for name, close in list(_CLOSE.items()):
        if _uses(item, name) and not any(_uses(i, name) for i in later):
            _CLOSE.pop(name, None)
            close()
