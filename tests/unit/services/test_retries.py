"""The transient-error budget: errors in a row and time spent failing, both, before a step gives up."""

from __future__ import annotations

import pytest

from remediation.services.retries import backoff, failing_too_long


@pytest.mark.parametrize(
    ("streak", "failing_s", "expected"),
    [
        (9, 242.0, True),  # past both bounds
        (8, 10_000.0, False),  # long, but not more than 8 errors in a row
        (30, 30.0, False),  # a quick burst (short Retry-After, many calls per attempt)
        (9, 240.0, True),  # the budget is inclusive
        (1, 0.0, False),
    ],
    ids=["both-bounds", "count-not-reached", "quick-burst", "budget-inclusive", "first-error"],
)
def test_failing_too_long_needs_both_the_count_and_the_time(streak: int, failing_s: float, expected: bool) -> None:
    assert failing_too_long(streak, failing_s, max_retries=8, budget_s=240.0) is expected


def test_default_backoff_reaches_the_default_budget_after_the_default_retries() -> None:
    """The defaults agree: 8 back-to-back errors, backed off from 2 s up to the 60 s countdown cap,
    take the 240 s budget, so the 9th error is the one that gives up."""
    waits = [min(backoff(n, None, 2.0, cap=300.0), 60.0) for n in range(8)]
    assert sum(waits) >= 240.0 > sum(waits[:7])


def test_backoff_never_undercuts_retry_after() -> None:
    assert backoff(0, 7.0, 2.0, cap=300.0) == 7.0
    assert backoff(10, None, 2.0, cap=300.0) == 300.0
