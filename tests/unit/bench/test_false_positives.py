"""The false-positive soak's published bound: the rule of three with no false action, Wilson's otherwise."""

from __future__ import annotations

import math

import pytest

from bench.false_positives import upper_95


@pytest.mark.parametrize(
    ("k", "n", "bound", "how"),
    [(0, 300, 0.01, "rule of three"), (0, 3, 1.0, "rule of three"), (1, 100, 0.0545, "Wilson"),
     (50, 100, 0.5961, "Wilson")],
    ids=["none-in-300", "none-in-3", "one-in-100", "half"],
)
def test_the_upper_bound_is_the_rule_of_three_or_wilsons(k: int, n: int, bound: float, how: str) -> None:
    value, named = upper_95(k, n)
    assert value == pytest.approx(bound, abs=5e-4) and named.startswith(how)


def test_no_signals_bound_nothing() -> None:
    value, named = upper_95(0, 0)
    assert math.isnan(value) and named == "no signals"
