"""Lemon scoring: decayed, class-weighted failures with distinct causes counted, and the policy
quarantining on the score as well as on N-in-W."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from remediation.domain.events import EventKind, NodeEvent, Source
from remediation.domain.lemon import Failure, score
from remediation.domain.policy import DecisionKind, NodeView, decide
from remediation.settings import LemonSettings, PolicySettings

NOW = datetime(2026, 3, 1, tzinfo=UTC)
DAY = timedelta(days=1)
CFG = LemonSettings(half_life_s=14 * 86400, threshold=2.5, distinct_bonus=0.25)


def test_a_failure_counts_half_after_one_half_life() -> None:
    fresh = score([Failure(NOW, "host")], NOW, CFG)
    old = score([Failure(NOW - 14 * DAY, "host")], NOW, CFG)
    assert fresh.score == pytest.approx(1.0)
    assert old.score == pytest.approx(0.5)
    assert "14-day half-life" in old.explanation


def test_weighted_by_class_and_fabric_is_not_the_nodes_fault() -> None:
    assert score([Failure(NOW, "gpu-memory")], NOW, CFG).score == pytest.approx(1.5)
    assert score([Failure(NOW, "software")], NOW, CFG).score == pytest.approx(0.5)
    assert score([Failure(NOW, "fabric")] * 5, NOW, CFG).score == 0.0
    assert score([Failure(NOW, None)], NOW, CFG).score == pytest.approx(1.0)  # before classification: unknown
    site = LemonSettings(weights={"software": 2.0})
    assert score([Failure(NOW, "software")], NOW, site).score == pytest.approx(2.0)


def test_distinct_causes_multiply_the_score() -> None:
    same = score([Failure(NOW, "host"), Failure(NOW, "host")], NOW, CFG)
    varied = score([Failure(NOW, "host"), Failure(NOW, "nvlink")], NOW, CFG)
    assert same.distinct == 1 and varied.distinct == 2
    assert varied.score == pytest.approx(same.score * 1.25)
    with_fabric = score([Failure(NOW, "host"), Failure(NOW, "fabric")], NOW, CFG)
    assert with_fabric.distinct == 1  # a zero-weight class does not make failures more varied


def test_history_beyond_the_horizon_or_in_the_future_is_not_read() -> None:
    s = score([Failure(NOW - 200 * DAY, "host"), Failure(NOW + DAY, "host")], NOW, CFG)
    assert (s.score, s.failures) == (0.0, 0)
    assert not s.over(CFG)


def test_explanation_names_each_class_its_count_and_the_threshold() -> None:
    s = score([Failure(NOW - 2 * DAY, "gpu-memory"), Failure(NOW - DAY, "gpu-memory"), Failure(NOW, "host")],
              NOW, CFG)
    assert "gpu-memory x2" in s.explanation and "host x1" in s.explanation
    assert "2 distinct cause(s)" in s.explanation and "quarantine at 2.5 with 3+ failures" in s.explanation
    assert s.over(CFG)


def test_two_failures_are_never_a_lemon_however_heavy() -> None:
    two = score([Failure(NOW - DAY, "gpu-hardware"), Failure(NOW, "gpu-memory")], NOW, CFG)
    assert two.score >= CFG.threshold and not two.over(CFG)  # N-in-W's business, not the lemon score's
    assert not score([Failure(NOW, "fabric")] * 4 + [Failure(NOW, "host")], NOW, CFG).over(CFG)


def _event(reason: str) -> NodeEvent:
    return NodeEvent(source=Source.SLURM, node="gpu-node-7", kind=EventKind.UNHEALTHY, state="FAIL",
                     reason=reason, observed_at=NOW)


def test_policy_quarantines_a_slow_lemon_that_n_in_w_misses() -> None:
    policy = PolicySettings(repeat_offender_count=3, repeat_offender_window_s=7 * 86400,
                            faults={"classify": True}, lemon={"enabled": True})
    # One failure a week for three weeks: never two within 7 days of the new one, so N-in-W (3 in 7d)
    # does not fire; the decayed score of four unknown failures does (1 + .74 + .55 + .41 = 2.7).
    history = [Failure(NOW - d * DAY, None) for d in (6, 12, 18)]
    decision = decide(_event("flaky again"), NodeView(recent_failures=1, history=history), policy)
    assert decision.kind is DecisionKind.QUARANTINE
    assert decision.reason.startswith("lemon: 4 failure(s)")
    assert decide(_event("flaky again"), NodeView(recent_failures=1, history=history[:1]), policy).kind \
        is DecisionKind.OPEN
    off = policy.model_copy(update={"lemon": LemonSettings(enabled=False)})
    assert decide(_event("flaky again"), NodeView(recent_failures=1, history=history), off).kind \
        is DecisionKind.OPEN


def test_policy_records_an_application_xid_until_it_repeats() -> None:
    policy = PolicySettings(faults={"classify": True, "app_xid_repeat_count": 3}, lemon={"enabled": False})
    first = decide(_event("xid 13"), NodeView(app_xids=0), policy)
    assert first.kind is DecisionKind.APP_XID
    assert "not a node fault" in first.reason and "1 of 3 within 1d" in first.reason
    third = decide(_event("xid 13"), NodeView(app_xids=2), policy)
    assert third.kind is DecisionKind.OPEN
    assert third.cause is not None and third.cause.fault_class == "software"
    assert "3 times within 1d" in third.cause.evidence
    off = PolicySettings(faults={"classify": False}, lemon={"enabled": False})
    assert decide(_event("xid 13"), NodeView(), off).kind is DecisionKind.OPEN
