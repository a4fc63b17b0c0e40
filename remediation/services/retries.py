"""When a step that met a transient error runs again, and when it gives up.

Kept apart from the workflow engine (:mod:`remediation.services.workflow`) because this is policy about
time, not about a step: the step row is the one retry counter, its failure streak (errors in a row
since the last success) sets the backoff, and :func:`failing_too_long` decides when a streak is long
enough, in count *and* in time, to give up. Celery's own retry count plays no part.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from remediation.db.models import RemediationStep
from remediation.domain.step_bodies import Escalate, Outcome
from remediation.domain.stepdetail import RetryState

EARLY_SLACK = timedelta(milliseconds=20)  # a timer firing a hair before its ETA is on time


def too_early(row: RemediationStep, now: datetime) -> bool:
    """The step's last transient error set a retry time that has not come yet."""
    retry_at = RetryState.load(row.detail).retry_at
    return retry_at is not None and retry_at - EARLY_SLACK > now


def backoff(retries: int, retry_after: float | None, base: float, cap: float) -> float:
    """Exponential backoff, never shorter than the server's Retry-After."""
    delay: float = min(cap, base * float(2 ** max(retries, 0)))
    return max(delay, float(retry_after or 0.0))


def failing_too_long(streak: int, failing_s: float, max_retries: int, budget_s: float) -> bool:
    """Give up on transient errors only when they come back to back: more than ``max_retries`` in a
    row *and* ``budget_s`` seconds without a success. Counting every error a step ever met would make a
    long operation polled through a noisy API climb the ladder while it was going well; counting only
    errors in a row would let a quick burst (short Retry-After, several calls per attempt) end a step
    that a few more seconds would have finished."""
    return streak > max_retries and failing_s >= budget_s


def gave_up(outcome: Outcome) -> bool:
    """An escalation that gave up on transient errors (its streak is not cleared by it)."""
    return isinstance(outcome, Escalate) and outcome.gave_up
