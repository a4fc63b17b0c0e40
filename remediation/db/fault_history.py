"""The reads behind cause classification and lemon scoring, one query each.

:func:`app_xid_counts`: application-level XIDs per node within the repeat window (decided
``app_xid``). :func:`failure_history`: each node's real failures since its last human release within
the lemon horizon, with their class, counted as the repeat-offender rule counts, plus each GPU check
that failed after the node looked recovered.

Why: docs/policy.md#lemons-the-score
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta

from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session

from remediation.clock import aware
from remediation.db.models import Event, Node, Remediation, Validation
from remediation.db.queries import among
from remediation.domain.lemon import Failure
from remediation.domain.policy import DecisionKind
from remediation.domain.states import ValidationOutcome


def app_xid_counts(session: Session, nodes: Iterable[str], now: datetime, *, window: timedelta) -> dict[str,
    int]:
    rows = session.execute(
        select(Event.node, func.count()).where(
            among(session, Event.node, nodes), Event.decision == DecisionKind.APP_XID, Event.observed_at > now - window)
        .group_by(Event.node))
    return {node: int(n) for node, n in rows}


def failure_history(session: Session, nodes: Iterable[str] | None, now: datetime,
                    *, horizon: timedelta) -> dict[str, list[Failure]]:
    """Per node (all nodes when ``nodes`` is None), oldest first."""
    q = (select(Remediation.node, Remediation.opened_at, Remediation.fault_class)
         .join(Node, Node.name == Remediation.node)
         .where(Remediation.opened_at > now - horizon, Remediation.dry_run.is_(False),
                Remediation.incident_id.is_(None),  # a node's part in a correlated incident is not its fault
                or_(Node.released_at.is_(None), Remediation.opened_at > Node.released_at))
         .order_by(Remediation.opened_at))
    if nodes is not None:
        q = q.where(among(session, Remediation.node, nodes))
    out: dict[str, list[Failure]] = {}
    for node, opened, cls in session.execute(q):
        out.setdefault(node, []).append(Failure(aware(opened), cls))
    # A GPU check that failed after the node looked recovered (validate before return) is evidence
    # against the node as much as the failure that opened its remediation: it weighs as one more.
    v = (select(Validation.node, Validation.finished_at, Remediation.fault_class)
         .join(Remediation, Remediation.id == Validation.remediation_id)
         .join(Node, Node.name == Validation.node)
         .where(Validation.outcome == ValidationOutcome.FAILED, Validation.dry_run.is_(False),
                Validation.finished_at > now - horizon, Remediation.incident_id.is_(None),
                or_(Node.released_at.is_(None), Validation.finished_at > Node.released_at)))
    if nodes is not None:
        v = v.where(among(session, Validation.node, nodes))
    for node, finished, cls in session.execute(v):
        out.setdefault(node, []).append(Failure(aware(finished), cls))
    for failures in out.values():
        failures.sort(key=lambda f: f.at)
    return out
