"""When a step that met a transient error runs again, and when it gives up.

The step row is the one retry counter: its failure streak (errors in a row since the last success)
sets the backoff, and :func:`failing_too_long` decides when a streak is long enough, in count *and* in
time, to give up. Kept apart from the workflow engine because it is policy about time, not about a
step.

Why: docs/policy.md#transient-errors-8-in-a-row-and-4-minutes-of-failing-both
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy.orm import Session, sessionmaker

from remediation.db.models import RemediationStep
from remediation.db.queries import remediation_locked, step_row
from remediation.domain.step_bodies import Escalate, Outcome
from remediation.domain.stepdetail import RetryState
from remediation.ports.errors import TransientError
from remediation.settings import WorkflowSettings

EARLY_SLACK = timedelta(milliseconds=20)  # a timer firing a hair before its ETA is on time


def too_early(row: RemediationStep, now: datetime) -> bool:
    """The step's last transient error set a retry time that has not come yet."""
    retry_at = RetryState.load(row.detail).retry_at
    return retry_at is not None and retry_at - EARLY_SLACK > now


def backoff(retries: int, retry_after: float | None, base: float, *, cap: float) -> float:
    """Exponential backoff, never shorter than the server's Retry-After."""
    delay: float = min(cap, base * float(2 ** max(retries, 0)))
    return max(delay, float(retry_after or 0.0))


def failing_too_long(streak: int, failing_s: float, max_retries: int, *, budget_s: float) -> bool:
    """Give up on transient errors only when they come back to back: more than ``max_retries`` in a
    row *and* ``budget_s`` seconds without a success. Counting every error a step ever met would make a
    long operation polled through a noisy API climb the ladder while it was going well; counting only
    errors in a row would let a quick burst (short Retry-After, several calls per attempt) end a step
    that a few more seconds would have finished."""
    return streak > max_retries and failing_s >= budget_s


def gave_up(outcome: Outcome) -> bool:
    """An escalation that gave up on transient errors (its streak is not cleared by it)."""
    return isinstance(outcome, Escalate) and outcome.gave_up


class RetryLater(Exception):
    """A transient error was recorded; retry the task after ``countdown`` seconds, as the delivery
    scheduled for ``due`` (None: the lease was lost and nothing was scheduled; see FollowUp.due)."""

    def __init__(self, cause: TransientError, countdown: float, due: datetime | None = None) -> None:
        super().__init__(f"{cause.message} (retry in {countdown:.1f}s)")
        self.cause = cause
        self.countdown = countdown
        self.due = due


@dataclass(frozen=True)
class Attempt:
    """The claimed attempt a transient error interrupted: its remediation, its step row, and the lease
    token that claims it."""

    rid: int
    row_id: int
    token: str


def record_transient(sessions: sessionmaker[Session], now: datetime, wf: WorkflowSettings, *, attempt: Attempt,
                     exc: TransientError) -> RetryLater | Escalate:
    """Record a transient error; retry after a backoff, or give up once the step has been failing
    back to back for longer than the budget (see :func:`failing_too_long`)."""
    with sessions() as s, s.begin():
        row = step_row(s, attempt.row_id)
        detail = dict(row.detail or {}) if row is not None else {}
        prior = RetryState.load(detail)
        streak, since = prior.streak + 1, prior.failing_since or now
        countdown = min(backoff(streak - 1, exc.retry_after, wf.backoff_base_s, cap=wf.backoff_max_s),
                        wf.max_wait_s)
        if exc.retry_after:
            countdown = max(countdown, exc.retry_after)
        if row is not None:
            row.retries = (row.retries or 0) + 1  # history: every transient error this attempt met
            row.error, row.error_kind = exc.message[:4000], exc.kind
            retry = RetryState(streak, since, exc.retry_after, now + timedelta(seconds=countdown))
            row.detail = {**detail, **retry.dump()}
        if failing_too_long(streak, (now - since).total_seconds(), wf.transient_retries,
                            budget_s=wf.transient_budget_s):
            # The lease stays ours: the caller records the escalation at once.
            return Escalate(f"gave up after {streak} transient errors in a row over "
                            f"{(now - since).total_seconds():.0f}s: {exc.message}", gave_up=True)
        rem = remediation_locked(s, attempt.rid)
        due = None
        if rem is not None and rem.lease_owner == attempt.token:
            rem.lease_owner = rem.lease_until = None
            rem.next_run_at = due = now + timedelta(seconds=countdown)
            rem.wait_reason = f"transient error, retrying: {exc.message}"[:2000]
    return RetryLater(exc, countdown, due)
