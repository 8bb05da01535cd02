"""Contract-test fixtures: the session's shared server processes.

Every process that imports vLLM costs about 30 CPU-seconds (a stub start, a resolver, a
probe script), and the suite has to finish in 15 minutes on 2 cores, so a new test file
adds as few of them as it can.  Fixtures for any contract test (new test files too):

* ``stub_pool``: one :class:`stub_pool.StubPool` of the stubs named in ``shared_stubs.py``
  (``T2V_KEYED``: keyed, 0.05 s steps, one job at a time, 2 GPUs with Ulysses 2: the argv the
  launcher's ``argv --json`` prints, run as is; ``I2V_SPLIT``: stdout and stderr
  apart; ``TI2V_OFFLOAD``: module offload, would OOM at load without it), each started when
  a test first asks for it: ``with stub_pool.lease(shared_stubs.TI2V_OFFLOAD) as (stub,):``.
  Use it whenever a test only sends requests and leaves the server as it found it (its jobs
  end or are deleted).  A job that runs out of GPU memory needs no stub of its own: send
  ``extra_params={"stub_oom": true}`` (see ``stub_vllm_serve.py``).  Start your own
  (``stubserver.run_stub``, or a Supervisor with the stub as its server command) only for an
  environment knob (``VLLM_OMNI_STUB_*``), a launch, or to end the process; then let one
  such server serve every check of its module (a module-scoped fixture, as
  ``test_cancel_stub.py`` and ``test_nodes_stub.py`` do) rather than one per test.
* ``upstream_resolver``: one :class:`stubserver.Resolver` (vLLM's parser and config
  resolution in one long-lived process): ``upstream_resolver.resolve(cases)``, a case per
  command line.  A check that needs other upstream calls than a resolve runs there too, as
  a ``{"call": "module:function", "input": ...}`` case (``upstream_resolve.py``; e.g.
  ``replica_probe.probe``, ``lora_loader_check.check``: it puts back what it sets up),
  instead of a script run in a server-python subprocess.
* ``server_env_python`` (tests/conftest.py): the server python; skips, saying so, when the
  server environment is not configured (for tests outside tests/contract).

Each process is ended right after the last test of the session that uses it (directly or
through another fixture), and the modules that use one run one after the other (their
order otherwise unchanged), so these processes never sit idle while the rest of the suite
runs: an idle stub costs a gigabyte of memory (and, were it not stopped between leases,
about a tenth of a core: upstream's orchestrator polls every millisecond).

Under pytest-xdist (tests/run.sh runs ``-n 2 --dist loadgroup``) every worker is its own
session, so the tests that share a process must run in one worker: the tests that use a
shared process, or a module-scoped fixture (e.g. a module's own server), get one
``xdist_group`` per connected set (a module whose fixture leases the pool joins the pool's
group), which ``tests/xdist_groups.py`` sends to one worker as a whole.  Everything else
spreads over the workers test by test.  A new test file needs nothing for this: using
``stub_pool`` (or a module-scoped fixture) is what puts its tests in a group.  Groups and
tests that take long go out first (``KNOWN_COST_S`` in ``tests/xdist_groups.py``): add a
new slow file or test there with the seconds ``--durations`` shows for it.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterator, Optional

import pytest

import shared_stubs
import stubserver
from stub_pool import StubPool
from processes import assert_no_process_left

from vllm_omni_launcher.server import registry

SHARED = ("stub_pool", "upstream_resolver")   # session fixtures that own a process
_CLOSE: dict[str, Callable[[], None]] = {}    # the open ones: fixture name -> close
_WIDE_SCOPES = ("module", "class", "package")  # fixtures that outlive one test: one worker runs their users


@pytest.fixture
def data_dir(tmp_path: Path) -> Iterator[Path]:
    """A supervised server's data dir; afterwards every server is stopped and no stub process is left,
    whatever a failing test left behind."""
    path = tmp_path / "data"
    yield path
    registry.stop_all(timeout=15)
    assert_no_process_left(path)


@pytest.fixture(scope="session")
def stub_pool() -> Iterator[StubPool]:
    stubserver.server_python()  # a missing server python fails every test that needs a stub, loudly
    pool = StubPool(shared_stubs.CONFIGS)
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


def _shared_resources(item: pytest.Item) -> list[str]:
    """What ``item`` shares with other tests: the shared processes it uses, and its module
    when it uses a fixture that lives longer than one test."""
    resources = [name for name in SHARED if _uses(item, name)]
    info = getattr(item, "_fixtureinfo", None)
    for defs in (info.name2fixturedefs.values() if info is not None else ()):
        if any(d.scope in _WIDE_SCOPES for d in defs):
            resources.append("module " + item.nodeid.split("::", 1)[0])
            break
    return resources


def _xdist_groups(items: list[pytest.Item]) -> dict[pytest.Item, str]:
    """One group name per connected set of tests that share a resource (union-find)."""
    parent: dict[str, str] = {}

    def root(r: str) -> str:
        while parent.setdefault(r, r) != r:
            r = parent[r]
        return r

    uses = {item: _shared_resources(item) for item in items}
    for resources in uses.values():
        for other in resources[1:]:
            parent[root(other)] = root(resources[0])
    return {item: "shared " + root(resources[0]) for item, resources in uses.items() if resources}


@pytest.hookimpl(tryfirst=True)   # before xdist's own hook reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Move the modules that use a shared process next to the first one that does; under
    pytest-xdist, put the tests that share a process or a module fixture in one group."""
    for name in SHARED:
        modules = {item.path for item in items if _uses(item, name)}
        first = next((i for i, item in enumerate(items) if item.path in modules), None)
        if first is None:
            continue
        tail = items[first:]
        items[first:] = [i for i in tail if i.path in modules] + [i for i in tail if i.path not in modules]
    if config.pluginmanager.hasplugin("xdist"):
        for item, group in _xdist_groups(items).items():
            item.add_marker(pytest.mark.xdist_group(group))


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: Optional[pytest.Item]) -> None:
    """End a shared process as soon as no later test of this session uses it."""
    items = item.session.items
    later = items[items.index(item) + 1:] if item in items else []
    for name, close in list(_CLOSE.items()):
        if _uses(item, name) and not any(_uses(i, name) for i in later):
            _CLOSE.pop(name, None)
            close()
