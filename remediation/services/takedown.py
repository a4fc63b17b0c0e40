"""Take down a check nobody waits for any more: its remediation was cancelled, or held for a human.

The sweeper finds each step row still running a check whose remediation is closed or held, calls the
validator's ``finish`` (check cancelled, drain put back, reservation deleted) and ends the row, so a
held remediation's ``resume`` starts a fresh check. A node a cancel gave back is given back again.

Why: docs/architecture.md#a-check-can-outlive-its-step
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import or_, select
from sqlalchemy.orm import Session, sessionmaker

from remediation.db.models import Node, Remediation, RemediationStep
from remediation.domain.ownership import give_back
from remediation.domain.statemachine import OPEN_STATUSES, NodeStatus
from remediation.domain.states import LIVE_STEP_STATUSES, StepStatus
from remediation.domain.step_bodies import Adapters
from remediation.services.step_rows import JOB_STEPS
from remediation.validation.rules import is_job_ref

log = logging.getLogger(__name__)

#: The rows looked at per sweep; the rest wait for the next one.
BATCH = 100
#: Only a remediation closed or held this recently: older rows are history (a check left running before
#: this sweeper existed ended long ago, and finishing it now would drain a node someone has resumed since).
RECENT = timedelta(hours=1)


@dataclass(frozen=True)
class Orphan:
    """A step row running a check whose remediation stopped waiting for it."""

    row_id: int
    node: str
    op: dict[str, Any]
    given_back: bool  # the cancel gave the node back: give it back again once the drain is put back


def orphans(s: Session, now: datetime) -> list[tuple[Orphan, Remediation]]:
    """The step rows still running a check (started or waiting, a job's reference recorded) whose
    remediation was closed or held for a human within :data:`RECENT`."""
    rows = s.execute(
        select(RemediationStep, Remediation)
        .join(Remediation, Remediation.id == RemediationStep.remediation_id)
        .where(RemediationStep.step.in_(JOB_STEPS), RemediationStep.status.in_(LIVE_STEP_STATUSES),
               RemediationStep.provider_op.is_not(None), Remediation.updated_at >= now - RECENT,
               or_(Remediation.status.not_in(OPEN_STATUSES), Remediation.context["held"].as_string().is_not(None)))
        .limit(BATCH)
    ).all()
    found = []
    for row, rem in rows:
        if not is_job_ref(row.provider_op) or (rem.status in OPEN_STATUSES and rem.ctx.held is None):
            continue
        node = s.get(Node, (rem.cluster, rem.node))
        healthy = rem.status not in OPEN_STATUSES and node is not None and node.status == NodeStatus.HEALTHY
        found.append((Orphan(row.id, rem.node, dict(row.provider_op or {}), healthy), rem))
    return found


def take_down(sessions: sessionmaker[Session], adapters_of: Callable[[Remediation], Adapters], prefix: str,
              *, now: Callable[[], datetime]) -> list[int]:
    """Finish every orphaned check (see the module docstring); returns the step rows ended. A finish
    that fails is logged and tried again at the next sweep."""
    with sessions() as s:
        work = [(orphan, adapters_of(rem)) for orphan, rem in orphans(s, now())]
    ended = []
    for orphan, ad in work:
        if ad.validator is None:
            continue
        try:
            note = ad.validator.finish(orphan.op)
            if orphan.given_back:
                note += "; " + give_back(ad, orphan.node, prefix)
        except Exception:  # noqa: BLE001 - the next sweep tries again; the node stays out meanwhile
            log.exception("could not take down the check of step row %s on %s", orphan.row_id, orphan.node)
            continue
        with sessions() as s, s.begin():
            row = s.get(RemediationStep, orphan.row_id, with_for_update=True)
            if row is not None and row.status in LIVE_STEP_STATUSES:
                row.status, row.finished_at = StepStatus.FAILED, now()
                row.error, row.error_kind = f"check taken down: its remediation stopped waiting ({note})"[:4000], \
                    "CheckTakenDown"
                ended.append(orphan.row_id)
    return ended
