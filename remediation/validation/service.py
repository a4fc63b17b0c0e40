"""The validation's records and its human uses.

:func:`record_validation` writes one ``validations`` row per check and a sighting of the GPUs it names;
:func:`hold_for_human` holds a check that never ended or could not run, paging once;
:func:`run_check` runs the same validation on demand (``remediation validate NODE``, ``release NODE
--validate``); :func:`summary` gives pass rate and durations.

Why: docs/policy.md#validate-before-return-a-gpu-validation-validationbackend-default-none
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from remediation.clock import aware
from remediation.db.models import HardwareSighting, Node, Remediation, RemediationStep, Validation
from remediation.db.scope import cluster_of
from remediation.domain.context import Held, RemediationContext
from remediation.domain.hardware import gpu_row, parse_gpus
from remediation.domain.outcomes import Outcome
from remediation.domain.slurm_states import SlurmState
from remediation.domain.statemachine import OPEN_STATUSES, RemediationStatus
from remediation.domain.states import AuditAction, CheckPurpose, StepStatus, ValidationOutcome
from remediation.domain.step_records import GpuCheckDetail, JobRecord, dumped
from remediation.domain.stepdetail import JobNonce
from remediation.ports.cluster import SlurmControl
from remediation.ports.dispatch import FollowUp
from remediation.services.audit import audit
from remediation.settings import Settings
from remediation.validation.port import ValidationResult, Validator
from remediation.validation.rules import (
    DEADLINE_SLACK_S,
    cause_class,
    check_for,
    describe,
    manual_check_name,
    start_job,
    verdict,
)

OUTCOMES = tuple(o for o in ValidationOutcome if o != ValidationOutcome.DRY_RUN)


class ValidationRefused(ValueError):
    """An on-demand check that cannot be run as asked; the message says why."""


def add_row(s: Session, rec: JobRecord, remediation_id: int | None, *, actor: str,
            dry_run: bool) -> Validation:
    row = Validation(
        remediation_id=remediation_id, node=rec.node, backend=rec.backend, name=rec.name,
        cause_class=rec.cause_class, command=" ".join(rec.command), outcome=rec.outcome,
        exit_code=rec.exit_code, started_at=rec.started_at, finished_at=rec.finished_at,
        duration_s=rec.duration_s, output_tail=rec.output, actor=actor, dry_run=dry_run,
    )
    s.add(row)
    if gpus := parse_gpus(rec.output):  # the GPUs the check's output names
        s.add(HardwareSighting(node=row.node, at=row.finished_at, remediation_id=remediation_id, step="validate",
                               gpus=[gpu_row(g) for g in gpus], dry_run=dry_run))
    return row


def record_validation(s: Session, rem: Remediation, outcome: Outcome, *, now: datetime, actor: str,
                      dry: bool) -> None:
    """Keep the check a ``validate`` step ended with (nothing while it runs, nothing in dry-run)."""
    detail = getattr(outcome, "detail", None)
    rec = detail.validation if isinstance(detail, GpuCheckDetail) else None
    if rec is not None and rec.outcome != ValidationOutcome.DRY_RUN:
        add_row(s, rec, rem.id, actor=actor, dry_run=dry)


def hold_for_human(s: Session, rem: Remediation, row: RemediationStep | None, *, outcome: Any, now: datetime,
                   settings: Settings) -> FollowUp:
    """Hold ``rem`` at its step until a human decides, paging once (the audit row notify posts). The
    step row ends ``failed`` so that a ``resume`` starts a fresh attempt (a new check)."""
    if row is not None:
        row.status, row.finished_at = StepStatus.FAILED, now
        row.error, row.error_kind = outcome.reason[:4000], outcome.kind[:64]
        row.detail = {**(row.detail or {}), **dumped(outcome.detail)}
    rem.ctx = replace(rem.ctx, held=Held(outcome.kind, outcome.reason[:1000], now.isoformat(), rem.step))
    rem.status, rem.updated_at = RemediationStatus.WAITING, now
    rem.wait_reason = f"held: {outcome.reason} (a human decides: resume, or cancel)"[:2000]
    wait = settings.workflow.max_wait_s
    rem.next_run_at = now + timedelta(seconds=wait)
    audit(s, now, settings.actor, action=AuditAction.VALIDATION_HELD, target=rem.node,
          reason=outcome.reason[:2000],
          detail={"remediation": rem.id, "kind": outcome.kind}, dry_run=bool(rem.dry_run))
    return FollowUp(rem.id, rem.step, wait)


@dataclass(frozen=True)
class ManualCheck:
    """A GPU check a human asked for: on which node, who asked, and for what (``purpose``)."""

    node: str
    actor: str
    purpose: CheckPurpose = CheckPurpose.VALIDATE


def run_check(
    sessions: sessionmaker[Session], validator: Validator, slurm: SlurmControl, *, asked: ManualCheck,
    settings: Settings, now: Callable[[], datetime],
) -> dict[str, Any]:
    """Run the validation once on ``asked.node`` (out of the Slurm pool, with no open remediation), wait for
    it and record it. Returns the record (``outcome``: passed, failed, timeout or cannot_run)."""
    node, actor, purpose = asked.node, asked.actor, asked.purpose
    with sessions() as s, s.begin():
        if s.get(Node, (cluster_of(s), node)) is None:
            raise ValidationRefused(f"unknown node {node!r}: it is not in the inventory")
        open_rem = s.scalar(select(Remediation.id).where(Remediation.node == node,
                                                         Remediation.status.in_(OPEN_STATUSES)))
        if open_rem is not None:
            raise ValidationRefused(f"{node} is under remediation #{open_rem}; its own validate step runs the check")
        # The cause of the node's last remediation picks the check (a quarantined node's, say).
        last = s.scalar(select(Remediation.context).where(Remediation.node == node)
                        .order_by(Remediation.id.desc()).limit(1))
        cls = cause_class(RemediationContext.load(last))
    snode = slurm.get_node(node)
    if SlurmState.DRAIN not in snode.flags:
        raise ValidationRefused(f"{node} is {'+'.join(sorted(snode.states))} in Slurm: drain it first (the "
                                "check runs only on a node out of the pool)")
    started = now()
    nonce = JobNonce.new().value  # this call waits for its check: nothing to find again, nothing to take for it
    name = manual_check_name(node, started.strftime("%Y%m%d%H%M%S"), nonce)
    check = check_for(settings.validation, node, name, cls=cls, nonce=nonce)
    op = start_job(validator, check, started)
    with sessions() as s, s.begin():
        audit(s, started, actor, action=purpose.started(), target=node,
              reason=f"GPU check {' '.join(check.command)} ({validator.backend})",
              detail={"name": check.name})
    result: ValidationResult = validator.poll(op)
    while not result.done:
        if (now() - started).total_seconds() > check.timeout_s + DEADLINE_SLACK_S:
            result = ValidationResult(done=True, exit_code=result.exit_code, output=result.output, state=result.state,
                                timed_out=True)
            break
        time.sleep(min(settings.validation.poll_interval_s, 5.0))
        result = validator.poll(op)
    taken_down = validator.finish(op)
    outcome, rec = verdict(op, result, now(), limit=settings.validation.output_bytes)
    with sessions() as s, s.begin():
        add_row(s, rec, None, actor=actor, dry_run=settings.dry_run)
        audit(s, now(), actor, action=purpose.ended(outcome), target=node,
              reason=f"{describe(rec)}; {taken_down}"[:2000],
              detail={"name": check.name, "exit_code": rec.exit_code}, dry_run=settings.dry_run)
    return {**rec.dump(), "undone": taken_down}


@dataclass(frozen=True)
class ValidationRow:
    """One check as ``nodes show``, the API and the dashboard show it."""

    id: int
    remediation_id: int | None
    started_at: datetime
    backend: str
    cause_class: str
    command: str
    outcome: str
    exit_code: int | None
    duration_s: float
    actor: str
    output_tail: str
    dry_run: bool


def node_validations(s: Session, node: str, limit: int = 10) -> list[ValidationRow]:
    """The node's latest checks, newest first."""
    rows = s.scalars(select(Validation).where(Validation.node == node)
                     .order_by(Validation.started_at.desc(), Validation.id.desc()).limit(limit))
    return [ValidationRow(v.id, v.remediation_id, aware(v.started_at) or v.started_at, v.backend, v.cause_class,
                          v.command, v.outcome, v.exit_code, v.duration_s, v.actor, v.output_tail, v.dry_run)
            for v in rows]


def summary(s: Session) -> dict[str, Any]:
    """Checks by outcome, the pass rate and the durations, over every real (non-dry-run) check."""
    rows = s.execute(select(Validation.outcome, func.count(), func.sum(Validation.duration_s))
                     .where(Validation.dry_run.is_(False)).group_by(Validation.outcome)).all()
    counts: dict[ValidationOutcome, int] = {outcome: 0 for outcome in OUTCOMES}
    seconds: dict[ValidationOutcome, float] = {outcome: 0.0 for outcome in OUTCOMES}
    for outcome, n, total in rows:
        counts[outcome] = int(n)
        seconds[outcome] = float(total or 0.0)
    passed, failed = counts[ValidationOutcome.PASSED], counts[ValidationOutcome.FAILED]
    ended = passed + failed
    return {"counts": counts, "seconds": seconds,
            "pass_rate": (passed / ended) if ended else None, "total": sum(counts.values())}
