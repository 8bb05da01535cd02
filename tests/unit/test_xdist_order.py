"""tests/xdist_groups.py's cost order: the scopes that take longest are sent to the workers
first, a scope's tests stay together and in order, and what is not measured keeps its place."""
from __future__ import annotations

from pathlib import Path

import pytest

import xdist_groups


@pytest.fixture
def costs(monkeypatch: pytest.MonkeyPatch) -> dict[str, float]:
    table = {"tests/a.py": 2.0, "tests/b.py::test_slow": 100.0, "tests/c.py::test_p[big]": 50.0,
             "tests/e.py::test_e": 3.0}
    monkeypatch.setattr(xdist_groups, "KNOWN_COST_S", table)
    monkeypatch.setattr(xdist_groups, "UNLISTED_COST_S", 0.5)
    return table


def test_a_test_counts_under_its_longest_listed_prefix(costs: dict[str, float]) -> None:
    assert xdist_groups._listed_prefix("tests/b.py::test_slow") == "tests/b.py::test_slow"
    assert xdist_groups._listed_prefix("tests/a.py::test_x[1]") == "tests/a.py"
    assert xdist_groups._listed_prefix("tests/c.py::test_p[big]") == "tests/c.py::test_p[big]"
    assert xdist_groups._listed_prefix("tests/c.py::test_p[small]") is None    # another parameter
    assert xdist_groups._listed_prefix("tests/b.py::test_fast") is None


def test_costliest_scope_first_groups_kept_whole_and_ties_in_collection_order(costs: dict[str, float]) -> None:
    units = [("tests/u.py::test_1", "tests/u.py::test_1"),      # 0.5
             ("group g", "tests/a.py::test_x"),                  # group g: file a once (2) + 0.5
             ("tests/u.py::test_2", "tests/u.py::test_2"),      # 0.5
             ("group g", "tests/a.py::test_y"),
             ("tests/b.py::test_slow", "tests/b.py::test_slow"),  # 100
             ("group g", "tests/d.py::test_z"),
             ("tests/c.py::test_p[big]", "tests/c.py::test_p[big]"),  # 50
             ("tests/e.py::test_e", "tests/e.py::test_e")]            # 3: above g, which counts a.py once
    assert xdist_groups.cost_order(units) == [4, 6, 7, 1, 3, 5, 0, 2]


def test_nothing_moves_without_measurements(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(xdist_groups, "KNOWN_COST_S", {})
    units = [(f"t{i}", f"t{i}") for i in range(5)] + [("group g", "x"), ("group g", "y")]
    # a two-test group costs more than one unlisted test; everything else keeps its order
    assert xdist_groups.cost_order(units) == [5, 6, 0, 1, 2, 3, 4]


def test_every_listed_cost_names_a_test_file_and_function_that_exist() -> None:
    """A renamed or deleted slow test must leave the table too (else it only costs order, silently)."""
    root = Path(__file__).resolve().parents[2]
    for prefix in xdist_groups.KNOWN_COST_S:
        path, _, test = prefix.partition("::")
        source = root / path
        assert source.is_file(), prefix
        assert not test or f"def {test.split('[')[0]}(" in source.read_text(encoding="utf-8"), prefix
