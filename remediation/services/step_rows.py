"""What a workflow step writes: the step row, the remediation row and, when it ends, the node's.

The engine (:mod:`remediation.services.workflow`) decides *when* to write; these functions are *what*
is written for each outcome: the open attempt, the next attempt's number, a wait, a move to the next
step (allowed transitions only), the close with the node's status and audit row, and a dry run's
"would ..." wording.

Why: docs/architecture.md#a-step-runs-in-three-phases
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from sqlalchemy import bindparam, func, select
from sqlalchemy.orm import Session

from remediation.db.models import Node, Remediation, RemediationStep
from remediation.domain.outcomes import Hold
from remediation.domain.statemachine import NodeStatus, RemediationStatus, Step, check_transition
from remediation.domain.states import LIVE_STEP_STATUSES, REMEDIATION_CLOSES, StepStatus
from remediation.domain.step_bodies import Cancel, Done, Escalate, Outcome, Quarantine, Wait
from remediation.domain.step_records import dumped
from remediation.domain.stepdetail import HeldTime, JobNonce
from remediation.ports.dispatch import FollowUp, Hint
from remediation.services.audit import audit, would

# The open attempt of a remediation's current step; built once, as every claim reads it. A step locks
# and reads the remediation row only: its step history (a selectin relationship, for the read models)
# is not loaded with it.
_CURRENT_ROW = (
    select(RemediationStep)
    .where(
        RemediationStep.remediation_id == bindparam("rid"),
        RemediationStep.step == bindparam("step"),
        RemediationStep.status.in_(LIVE_STEP_STATUSES),
    )
    .order_by(RemediationStep.id.desc())
    .limit(1)
)


def next_attempt(s: Session, rid: int, step: Step) -> int:
    """The attempt number a new row of ``step`` gets."""
    done = s.scalar(select(func.count()).where(RemediationStep.remediation_id == rid,
                                               RemediationStep.step == step))
    return 1 + (done or 0)


#: The steps that may run a job on the node (the GPU check; a GPU reset on the machine step).
JOB_STEPS = frozenset({Step.VALIDATE, Step.VM_RESTART, Step.COLLECT_EVIDENCE})


def new_row(rid: int, step: Step, attempt: int, *, now: datetime, dry_run: bool) -> RemediationStep:
    """A new attempt's step row. A step that may run a job gets the nonce of the job's names here,
    committed with the row, before the step body submits anything."""
    return RemediationStep(
        remediation_id=rid, step=step, attempt=attempt, idempotency_key=f"r{rid}:{step}:{attempt}",
        status=StepStatus.STARTED, started_at=now, checks=0, retries=0, dry_run=dry_run,
        detail=JobNonce.new().dump() if step in JOB_STEPS else {},
    )


def live_row(s: Session, rid: int, step: Step) -> RemediationStep | None:
    """The open attempt (started or waiting) of ``step`` in remediation ``rid``."""
    return s.scalars(_CURRENT_ROW, {"rid": rid, "step": step}).first()


def current_row(s: Session, rem: Remediation) -> RemediationStep | None:
    """The open attempt of the remediation's current step."""
    return live_row(s, rem.id, rem.step)


def as_dry_run(outcome: Outcome) -> Outcome:
    """Dry-run rows say "would ...": nothing outside was changed (see remediation.services.audit.would)."""
    if isinstance(outcome, Done):
        return replace(outcome, outcome=would(outcome.outcome))
    if isinstance(outcome, (Cancel, Escalate, Quarantine, Hold)):
        return replace(outcome, reason=would(outcome.reason))
    return outcome


def record_wait(rem: Remediation, row: RemediationStep | None, w: Wait, *, now: datetime) -> FollowUp:
    """The step waits: its row and the remediation say on what, and when to look again."""
    if row is not None:
        row.status = StepStatus.WAITING
        row.checks += 1
        row.outcome = w.reason[:4000]
        if w.provider_op is not None:
            row.provider_op = w.provider_op
        row.detail = {**(row.detail or {}), **dumped(w.detail)}
    rem.status, rem.wait_reason = RemediationStatus.WAITING, w.reason[:2000]
    rem.next_run_at = now + timedelta(seconds=w.countdown)
    return FollowUp(rem.id, rem.step, w.countdown, Hint.WAIT, due=rem.next_run_at)


def record_gate(rem: Remediation, row: RemediationStep | None, reason: str, *, now: datetime,
                countdown: float) -> bool:
    """Admission (or an incident) keeps the step from acting: the remediation waits on ``reason``, and a
    started attempt's clock stops until it runs again (a pause never counts toward its timeout). Returns
    whether the hold is new (its reason changed), so that it is logged once, not once per look."""
    if row is not None:
        row.detail = {**(row.detail or {}), **HeldTime.load(row.detail).holding(now).dump()}
    new = rem.wait_reason != reason or rem.status != RemediationStatus.WAITING
    rem.status, rem.wait_reason = RemediationStatus.WAITING, reason
    rem.next_run_at, rem.updated_at = now + timedelta(seconds=countdown), now
    return new


def move(rem: Remediation, step: Step, nxt: Step, *, now: datetime) -> FollowUp:
    """Move the remediation to its next step, through an allowed transition only."""
    check_transition(step, nxt)
    rem.step, rem.status, rem.wait_reason, rem.next_run_at = nxt, RemediationStatus.RUNNING, None, now
    return FollowUp(rem.id, nxt, due=now)


@dataclass(frozen=True)
class Ending:
    """How a remediation ends: its status, the error that ended it, and whether its node is healthy
    after all (a cancel's ``node_healthy``)."""

    status: RemediationStatus
    error: str | None = None
    node_healthy: bool = False


def close(s: Session, rem: Remediation, end: Ending, *, now: datetime, actor: str) -> None:
    """End ``rem`` as ``end`` says, set its node's status to match, and audit it as ``actor``."""
    status, error, node_healthy = end.status, end.error, end.node_healthy
    rem.status, rem.closed_at, rem.next_run_at, rem.step = status, now, None, Step.DONE
    why = rem.ctx.quarantine_reason or rem.cause
    rem.outcome = error or (why if status is RemediationStatus.QUARANTINED else status.value)
    node = s.get(Node, (rem.cluster, rem.node), with_for_update=True)
    if node is not None:
        node.updated_at = now
        if status is RemediationStatus.SUCCEEDED:
            node.status, node.status_reason = NodeStatus.HEALTHY, f"remediation #{rem.id} succeeded"
        elif node_healthy:
            node.status, node.status_reason = NodeStatus.HEALTHY, error or "healthy"
        elif status is RemediationStatus.QUARANTINED:
            node.status, node.status_reason = NodeStatus.QUARANTINED, why
            node.quarantined_at, node.quarantine_reason = now, why
        else:
            node.status, node.status_reason = NodeStatus.UNHEALTHY, f"remediation #{rem.id} {status}: {error}"
    dry = bool(rem.dry_run)
    if dry:
        rem.outcome = would(rem.outcome or "")
    audit(s, now, actor, action=REMEDIATION_CLOSES[status], target=rem.node, reason=rem.outcome or "",
          detail={"remediation": rem.id}, dry_run=dry)
