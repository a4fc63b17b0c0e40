"""The typed keys of a step row's detail read what the engine wrote before they were typed."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from remediation.domain.step_records import DrainDetail
from remediation.domain.stepdetail import RetryState

T = datetime(2026, 3, 1, tzinfo=UTC)


def test_a_streak_round_trips_with_the_keys_it_always_had() -> None:
    old = {"streak": 3, "failing_since": T.isoformat(), "retry_after": None, "retry_at": T.isoformat(), "jobs": []}
    state = RetryState.load(old)
    assert state == RetryState(3, T, None, T)
    assert {**old, **state.dump()} == old


@pytest.mark.parametrize("detail", [None, {}, {"streak": "two", "retry_at": "soon", "failing_since": 5},
                                    {"streak": True}], ids=["null", "empty", "malformed", "bool"])
def test_nothing_readable_is_no_streak(detail: dict[str, Any] | None) -> None:
    assert RetryState.load(detail) == RetryState()


def test_a_success_ends_the_streak_and_keeps_the_retry_record() -> None:
    detail = {**RetryState(2, T, 1.5, T).dump(), "jobs": ["1"]}
    assert RetryState.cleared(detail, keep_retry_record=True) == {"retry_after": 1.5, "retry_at": T.isoformat(),
                                                                  "jobs": ["1"]}
    assert RetryState.cleared(detail) == {"retry_after": 1.5, "jobs": ["1"]}


def test_the_drains_job_progress_reads_old_rows_and_tolerates_junk() -> None:
    assert DrainDetail.load({"jobs_acted": ["7", 8], "jobs_timeout_paged": True}) == DrainDetail(
        acted=("7", "8"), timeout_paged=True)
    assert DrainDetail.load({"jobs_acted": "7"}) == DrainDetail()
    assert DrainDetail(acted=("7",)).dump() == {"jobs_acted": ["7"]}


def test_an_error_hold_reads_back_and_junk_is_no_hold() -> None:
    from remediation.domain.stepdetail import ErrorHold, HoldScope

    hold = ErrorHold(HoldScope.UNMAPPED, T)
    assert hold.dump() == {"scope": "unmapped", "held_at": T.isoformat()}
    assert ErrorHold.load(hold.dump()) == hold
    assert ErrorHold.load({"scope": "node", "held_at": T.isoformat()}) is None
    assert ErrorHold.load({"scope": "system", "held_at": 5}) is None
