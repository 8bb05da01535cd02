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

Order: a 2-core run is only as short as its last worker, so the scopes that take longest go
out first and the many short ones fill the gaps at the end.  The scheduler hands scopes out
in collection order (xdist's own reorder, by number of tests, is turned off), and
:func:`order_by_cost` sorts the collection by the cost of each scope: the sum of its tests'
entries in ``KNOWN_COST_S`` (measured seconds; a test not listed counts as short), ties
kept in collection order.  Each scope's tests keep their order, so the contract conftest's
arrangement (the modules that share a process next to each other) stands.
"""
from __future__ import annotations

import contextlib
import json
import os
import tempfile
from typing import Any, Optional

import pytest

GROUPS_FILE_ENV = "PYTEST_VLLM_OMNI_XDIST_GROUPS"   # set by the controller, read by its workers

# Seconds that the tests under a node id prefix (one test, or a file) took together in a
# CI run of tests/run.sh on a 2-core box (pytest --durations: setup + call + teardown);
# only the slow ones matter.  A scope counts each prefix once, so list a file whose tests
# run as one group (a module fixture, a shared stub), and single tests otherwise.  Re-measure
# when a slow test changes a lot; a stale entry costs only order.
_C = "tests/contract/"
_FAULTS, _LIFE = _C + "test_supervisor_faults.py::", _C + "test_supervisor_lifecycle.py::"
KNOWN_COST_S: dict[str, float] = {
    # groups (one worker each): the shared stubs' modules, the resolver's, a module's own server
    _C + "test_stub_server_serves_like_upstream.py": 100, _C + "test_stub_server_refuses_and_fails_like_upstream.py": 100,
    _C + "test_client_stub.py": 130,
    _C + "test_spec_contract.py": 80, _C + "test_cancel_stub.py": 80,
    _C + "test_nodes_stub.py::test_local_server_handle_is_small_and_secret_free": 80,
    _C + "test_nodes_stub.py::test_generate_starts_a_stopped_local_server_again_without_rerunning_local_server": 50,
    _C + "test_lora_contract.py::test_per_request_lora_keeps_the_server_and_a_fused_one_restarts_it": 80,
    "tests/unit/test_template_run_on_stub.py::test_ti2v_text_to_video_template_runs_end_to_end_on_the_stub_server": 110,
    # single tests that start servers of their own
    _LIFE + "test_keep_alive_then_spec_changes_stop_overlapping_servers": 120,
    _FAULTS + "test_slow_load_progress_hard_cancel_and_crash_restart": 110,
    _FAULTS + "test_oom_in_job_keeps_the_server_and_a_hang_restarts_it": 100,
    _LIFE + "test_left_behind_servers_are_adopted_or_stopped": 55,
    _FAULTS + "test_cancel_while_loading_stops_everything_within_2s": 40,
    _LIFE + "test_server_dies_with_its_sigkilled_owner": 40,
    _LIFE + "test_serve_cli_notifies_systemd_and_its_sigterm_stop_leaves_nothing_to_kill": 40,
    _C + "test_replicas_supervised.py::test_a_dead_replica_restarts_the_server_and_stop_leaves_nothing": 120,
    _C + "test_join_head.py": 670,
    _C + "test_generate_pipelines_cli.py::test_vace_follows_a_control_video_file_and_returns_its_frames": 35,
    _C + "test_generate_pipelines_cli.py::test_speech_to_video_animates_an_image_to_a_wav_file": 35,
    _C + "test_nodes_stub.py::test_cancel_deletes_the_job_and_restarts_a_server_still_busy": 60,
    _C + "test_nodes_stub.py::test_auto_serving_falls_back_down_the_planner_ladder_on_oom": 80,
    _C + "test_nodes_stub.py::test_auto_fallback_off_stops_with_the_plan_and_the_fix": 40,
    _C + "test_generate_auto.py": 60,
    _C + "test_prestart_last_server.py": 35,
    _C + "test_supervised_mp4_read_from_storage.py": 30,
}
UNLISTED_COST_S = 0.5


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


def _listed_prefix(nodeid: str) -> Optional[str]:
    """The longest prefix of ``nodeid`` (cut at ``::`` or ``[``) in ``KNOWN_COST_S``."""
    prefix = nodeid
    while prefix:
        if prefix in KNOWN_COST_S:
            return prefix
        cut = max(prefix.rfind("::"), prefix.rfind("["))
        prefix = prefix[:cut] if cut > 0 else ""
    return None


def _scope(item: pytest.Item) -> str:
    """What the scheduler below sends as one unit: the test's xdist group, or the test itself."""
    mark = item.get_closest_marker("xdist_group")
    return f"group {mark.args[0]}" if mark is not None and mark.args else item.nodeid


def cost_order(units: list[tuple[str, str]]) -> list[int]:
    """The indices of ``units`` (``(scope, nodeid)`` pairs in collection order) with the
    costliest scope first; a scope's tests stay together and in order, equal costs keep
    collection order.  A scope costs its listed prefixes (each once) plus
    ``UNLISTED_COST_S`` per test under none."""
    cost: dict[str, float] = {}
    first: dict[str, int] = {}
    counted: set[tuple[str, str]] = set()
    for index, (scope, nodeid) in enumerate(units):
        first.setdefault(scope, index)
        prefix = _listed_prefix(nodeid)
        if prefix is None:
            cost[scope] = cost.get(scope, 0.0) + UNLISTED_COST_S
        elif (scope, prefix) not in counted:
            counted.add((scope, prefix))
            cost[scope] = cost.get(scope, 0.0) + KNOWN_COST_S[prefix]
        else:
            cost.setdefault(scope, 0.0)
    return sorted(range(len(units)), key=lambda i: (-cost[units[i][0]], first[units[i][0]], i))


def order_by_cost(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Worker of a ``-n N --dist loadgroup`` run: sort ``items`` by :func:`cost_order` (run
    after the groups are marked).  A worker's own options say ``--dist no`` (xdist resets
    them); the groups file the controller named is what marks such a run."""
    if not hasattr(config, "workerinput") or not os.environ.get(GROUPS_FILE_ENV):
        return
    order = cost_order([(_scope(item), item.nodeid) for item in items])
    items[:] = [items[i] for i in order]


def make_scheduler(config: pytest.Config, log: Any) -> Optional[Any]:
    """The controller's scheduler for ``--dist loadgroup`` (None: xdist's own choice)."""
    if not _distributing_by_group(config):
        return None
    config.option.loadscopereorder = False    # the collection is in cost order (order_by_cost)
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
