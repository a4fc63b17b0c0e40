"""The reads the domain needs, each one query, shared by ingest, the workflow and on-call views.

Kept apart from the models so that the SQL that serves the hot path (ingest, gating) is easy to find
and to index for: nodes by name, remediations by (node, opened_at) and (status, next_run_at).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, func, or_, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from remediation.clock import aware
from remediation.db.models import Control, Node, Remediation, RemediationStep
from remediation.policy import ClusterView
from remediation.states import OPEN_STATUSES, Step

PAUSED = "paused"
BREAKER = "breaker"
LAST_VM_ACTION = "last_vm_action"


def control_get(session: Session, key: str) -> dict[str, Any]:
    value = session.execute(select(Control.value).where(Control.key == key)).scalar_one_or_none()
    return dict(value) if value else {}


def control_set(session: Session, key: str, value: dict[str, Any], now: datetime) -> None:
    """Upsert: two workers noticing the same change at once must not collide on the key."""
    dialect = session.get_bind().dialect.name
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    stmt = insert(Control).values(key=key, value=value, updated_at=now)
    session.execute(stmt.on_conflict_do_update(index_elements=["key"], set_={"value": value, "updated_at": now}))


def is_paused(session: Session) -> bool:
    return bool(control_get(session, PAUSED).get("paused"))


def open_remediations_for(session: Session, nodes: Iterable[str]) -> dict[str, int]:
    rows = session.execute(
        select(Remediation.node, Remediation.id).where(
            Remediation.node.in_(list(nodes)), Remediation.status.in_(OPEN_STATUSES)
        )
    )
    return {node: rid for node, rid in rows}


def recent_failure_counts(
    session: Session, nodes: Iterable[str], now: datetime, window: timedelta
) -> dict[str, int]:
    """Remediations opened per node within the window, counting only those after a human release."""
    start = now - window
    rows = session.execute(
        select(Remediation.node, func.count())
        .join(Node, Node.name == Remediation.node)
        .where(
            Remediation.node.in_(list(nodes)),
            Remediation.opened_at > start,
            or_(Node.released_at.is_(None), Remediation.opened_at > Node.released_at),
        )
        .group_by(Remediation.node)
    )
    return {node: int(n) for node, n in rows}


def cluster_view(session: Session, now: datetime, breaker_window: timedelta, exclude: int | None) -> ClusterView:
    pool = session.scalar(select(func.count()).select_from(Node)) or 0
    failed = session.scalar(
        select(func.count(func.distinct(Remediation.node))).where(
            Remediation.opened_at > now - breaker_window
        )
    ) or 0
    in_flight = select(func.count(func.distinct(Remediation.id))).where(
        Remediation.status.in_(OPEN_STATUSES),
        Remediation.id != (exclude if exclude is not None else -1),
        or_(
            Remediation.step == Step.VERIFY,
            and_(
                Remediation.step == Step.VM_RESTART,
                Remediation.id.in_(
                    select(RemediationStep.remediation_id).where(
                        RemediationStep.step == Step.VM_RESTART,
                        RemediationStep.status.in_(("started", "waiting")),
                    )
                ),
            ),
        ),
    )
    last = control_get(session, LAST_VM_ACTION).get("at")
    return ClusterView(
        paused=is_paused(session),
        pool_size=int(pool),
        failed_in_window=int(failed),
        vm_active=int(session.scalar(in_flight) or 0),
        last_vm_action_at=aware(datetime.fromisoformat(last)) if last else None,
    )
