"""A remote job's share done from time alone (client/progress_estimate.py): it follows the estimate
to 80 %, then keeps moving and never looks done; with no estimate it moves with the time elapsed."""
from __future__ import annotations

from vllm_omni_launcher.client.progress_estimate import ELAPSED_HALF_S, elapsed_fraction, estimated_fraction


def test_estimated_fraction_is_continuous_monotone_and_never_done():
    values = [estimated_fraction(t / 10, 20.0) for t in range(0, 2000)]
    assert all(b >= a for a, b in zip(values, values[1:])) and max(values) < 1.0
    assert abs(estimated_fraction(16.0, 20.0) - 0.8) < 1e-9
    assert abs(estimated_fraction(16.001, 20.0) - estimated_fraction(15.999, 20.0)) < 1e-3


def test_elapsed_fraction_is_half_way_at_its_half_time_and_never_full():
    values = [elapsed_fraction(float(t)) for t in range(0, 36_000, 7)]
    assert values[0] == 0.0 and all(b > a for a, b in zip(values, values[1:])) and max(values) < 1.0
    assert elapsed_fraction(ELAPSED_HALF_S) == 0.5
    assert elapsed_fraction(-5.0) == 0.0                 # a clock that went back shows an empty bar
