"""``--dist loadgroup`` for pytest-xdist that works on every pytest this suite runs on.

tests/run.sh runs two xdist workers.  Tests that share a server process (a session fixture
such as ``stub_pool``, or a module-scoped fixture) must run in one worker, or each worker
starts its own copy (a stub start costs a vLLM import, tens of seconds); the contract
conftest marks them with ``xdist_group``.  pytest-xdist's own ``loadgroup`` passes the
group to its controller by appending ``@group`` to each test's node id through a private
attribute that pytest 9.2 no longer reads, so there every test would be scheduled alone.

Here the groups travel in a file instead: the controller names it in an environment
variable before it starts the workers, each worker writes ``{nodeid: group}`` for the tests
it collected (all workers collect the same tests), and the controller's scheduler reads it
once every worker has collected.  Scheduling is xdist's ``loadscope`` (whole groups to one
worker, biggest first, each worker topped up as it runs dry), with a test that has no group
as a scope of its own.  Without xdist, or with another ``--dist``, nothing here acts.
"""
from __future__ import annotations

import contextlib
import json
import os
import tempfile
from typing import Any, Optional

import pytest

GROUPS_FILE_ENV = "PYTEST_VLLM_OMNI_XDIST_GROUPS"   # set by the controller, read by its workers


def _distributing_by_group(config: pytest.Config) -> bool:
    return (config.pluginmanager.hasplugin("xdist") and bool(config.getoption("numprocesses", None))
            and config.getoption("dist", "no") == "loadgroup")


def configure(config: pytest.Config) -> None:
    """Controller of a ``-n N --dist loadgroup`` run: name the groups file for the workers."""
    if hasattr(config, "workerinput") or not _distributing_by_group(config):
        return
    fd, path = tempfile.mkstemp(prefix="pytest-xdist-groups-", suffix=".json")
    os.close(fd)
    os.environ[GROUPS_FILE_ENV] = path

    def remove() -> None:
        os.environ.pop(GROUPS_FILE_ENV, None)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)

    config.add_cleanup(remove)


def write_groups(session: pytest.Session) -> None:
    """Worker: leave the group of every collected test for the controller (atomically)."""
    path = os.environ.get(GROUPS_FILE_ENV)
    if not path or not hasattr(session.config, "workerinput"):
        return
    groups = {item.nodeid: str(mark.args[0]) for item in session.items
              if (mark := item.get_closest_marker("xdist_group")) is not None and mark.args}
    tmp = f"{path}.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(groups, f)
    os.replace(tmp, path)


def make_scheduler(config: pytest.Config, log: Any) -> Optional[Any]:
    """The controller's scheduler for ``--dist loadgroup`` (None: xdist's own choice)."""
    if not _distributing_by_group(config):
        return None
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        """xdist's loadscope with the scope of a test = its group, or the test itself."""

        _groups: Optional[dict[str, str]] = None

        def _split_scope(self, nodeid: str) -> str:
            if self._groups is None:     # first asked once every worker has collected
                try:
                    with open(os.environ[GROUPS_FILE_ENV], encoding="utf-8") as f:
                        self._groups = json.load(f)
                except (KeyError, OSError, ValueError):
                    self._groups = {}
            group = self._groups.get(nodeid)
            return f"group {group}" if group is not None else nodeid

    return GroupScheduling(config, log)
