"""The statistics ``python -m bench.many_clusters`` judges its goals by: the detection p50s against the
one cluster alone, and the p90 of the faults drained beside a storm, a fault never drained counting."""

from __future__ import annotations

import math

import pytest

from bench.many_clusters import detection_goal, detection_ratios, drain_goal


def test_each_clusters_p50_is_divided_by_the_one_cluster_alones() -> None:
    alone = [0.1, 0.2, 0.3]
    assert detection_ratios(alone, {"c0": [0.2, 0.4, 0.6], "c1": [0.3]}) == pytest.approx({"c0": 2.0, "c1": 1.5})


def test_a_cluster_that_saw_nothing_is_infinitely_slower() -> None:
    assert detection_ratios([0.1], {"c0": []}) == {"c0": math.inf}


@pytest.mark.parametrize(
    ("fleet", "alone", "ok"),
    [
        ({"c0": [0.15, 0.15], "c1": [0.14, 0.16]}, [0.1, 0.1], True),  # x1.5 at worst: met
        ({"c0": [0.15, 0.15], "c1": [0.16, 0.16]}, [0.1, 0.1], False),  # c1 at x1.6
        ({"c0": [0.1, 0.1], "c1": [0.1]}, [0.1, 0.1], False),  # one of c1's changes never seen
        ({"c0": [0.1, 0.1], "c1": [0.1, 0.1]}, [0.1], False),  # one change alone never seen
    ],
    ids=["within", "one-cluster-slower", "fleet-change-missed", "alone-change-missed"],
)
def test_the_detection_goal(fleet: dict[str, list[float]], alone: list[float], ok: bool) -> None:
    measured, met = detection_goal(alone, fleet, changes=2)
    assert met is ok
    assert "alone p50 0.100 s" in measured


def test_the_drain_goal_is_judged_at_the_p90_of_the_tries() -> None:
    tries = [0.5] * 18 + [1.9, 9.0]  # 20 tries: the p90 is the 18th fastest
    measured, ok = drain_goal(tries)
    assert ok and measured == "p90 0.50 s, max 9.00 s, 20/20 drained"
    assert drain_goal([0.5] * 17 + [2.1, 2.2, 2.3]) == ("p90 2.10 s, max 2.30 s, 20/20 drained", False)


def test_a_fault_never_drained_counts_as_never() -> None:
    measured, ok = drain_goal([0.5] * 17 + [None, None, None])
    assert not ok and measured == "p90 inf s, max inf s, 17/20 drained"
