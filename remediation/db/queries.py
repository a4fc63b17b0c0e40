"""The reads the domain needs, each one query, shared by ingest, the workflow and on-call views.

Kept apart from the models so that the SQL that serves the hot path (ingest, gating) is easy to find
and to index for: nodes by name, remediations by (node, opened_at) and (status, next_run_at).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import String, and_, any_, bindparam, func, or_, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.orm import Session

from remediation.clock import aware
from remediation.db.models import Control, Event, Node, Remediation, RemediationStep
from remediation.domain.attribution import Condition, Window, healthy_observations
from remediation.domain.policy import ClusterView
from remediation.domain.statemachine import OPEN_STATUSES, Step

PAUSED = "paused"
BREAKER = "breaker"
LAST_VM_ACTION = "last_vm_action"


def control_get(session: Session, key: str) -> dict[str, Any]:
    value = session.execute(select(Control.value).where(Control.key == key)).scalar_one_or_none()
    return dict(value) if value else {}


def controls_get(session: Session, *keys: str) -> dict[str, dict[str, Any]]:
    """Several control rows in one statement (the gate reads three per step); a missing one is {}."""
    found = session.execute(select(Control.key, Control.value).where(Control.key.in_(keys))).tuples().all()
    rows: dict[str, Any] = dict(found)
    return {k: dict(rows[k]) if rows.get(k) else {} for k in keys}


def control_set(session: Session, key: str, value: dict[str, Any], now: datetime) -> None:
    """Upsert: two workers noticing the same change at once must not collide on the key."""
    dialect = session.get_bind().dialect.name
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    stmt = insert(Control).values(key=key, value=value, updated_at=now)
    session.execute(stmt.on_conflict_do_update(index_elements=["key"], set_={"value": value, "updated_at": now}))


def among(session: Session, column: Any, values: Iterable[str]) -> Any:
    """``column IN values`` for a batch's worth of names. On Postgres as ``= ANY(array)``: one short
    statement whatever the count (an expanded IN of 500 names is a new 500-parameter text the driver
    parses per batch); elsewhere the portable IN."""
    names = list(values)
    if session.get_bind().dialect.name == "postgresql":
        return column == any_(bindparam(None, names, type_=ARRAY(String), unique=True))
    return column.in_(names)


def lock_control(s: Session, key: str, now: datetime) -> dict[str, Any]:
    """Lock one ``control`` row until the transaction ends (creating it empty if missing) and return
    its value as committed by whoever held the lock before. On SQLite, BEGIN IMMEDIATE already
    serialises the transaction."""
    insert = postgresql.insert if s.get_bind().dialect.name == "postgresql" else sqlite.insert
    s.execute(insert(Control).values(key=key, value={}, updated_at=now).on_conflict_do_nothing(index_elements=["key"]))
    value = s.execute(select(Control.value).where(Control.key == key).with_for_update()).scalar_one()
    return dict(value or {})


def is_paused(session: Session) -> bool:
    return bool(control_get(session, PAUSED).get("paused"))


def open_remediations_for(session: Session, nodes: Iterable[str]) -> dict[str, int]:
    rows = session.execute(
        select(Remediation.node, Remediation.id).where(
            among(session, Remediation.node, nodes), Remediation.status.in_(OPEN_STATUSES)
        )
    )
    return {node: rid for node, rid in rows}


def recent_failure_counts(
    session: Session, nodes: Iterable[str], now: datetime, window: timedelta
) -> dict[str, int]:
    """Fault episodes per node within the window, counting only those after a human release.

    An episode is one remediation and every signal explained by it: the events that opened it or
    arrived while it ran, and those its own actions caused up to ``policy.settle_s`` after it
    closed, which are attributed to it and never open another. So however many events one episode
    produces, it is one row here. A different fault is a new episode, and counts."""
    start = now - window
    rows = session.execute(
        select(Remediation.node, func.count())
        .join(Node, Node.name == Remediation.node)
        .where(
            among(session, Remediation.node, nodes),
            Remediation.opened_at > start,
            or_(Node.released_at.is_(None), Remediation.opened_at > Node.released_at),
            Remediation.dry_run.is_(False),  # dry-run history never counts (issue 11)
            Remediation.incident_id.is_(None),  # nor does a node's part in a correlated incident
        )
        .group_by(Remediation.node)
    )
    return {node: int(n) for node, n in rows}


def latest_windows(session: Session, nodes: Iterable[str]) -> dict[str, Window]:
    """Each node's latest remediation (open or closed) with the start of its first VM action: what
    attribution compares a signal with."""
    names = list(nodes)
    latest = select(func.max(Remediation.id)).where(among(session, Remediation.node, names)).group_by(Remediation.node)
    rems = session.execute(
        select(Remediation.id, Remediation.node, Remediation.opened_at, Remediation.closed_at, Remediation.dry_run)
        .where(Remediation.id.in_(latest))
    ).all()
    if not rems:
        return {}
    vm_at = dict(session.execute(
        select(RemediationStep.remediation_id, func.min(RemediationStep.started_at))
        .where(RemediationStep.remediation_id.in_([r.id for r in rems]), RemediationStep.step == Step.VM_RESTART)
        .group_by(RemediationStep.remediation_id)
    ).all())
    return {
        r.node: Window(r.id, aware(r.opened_at), aware(r.closed_at), aware(vm_at.get(r.id)),  # type: ignore[arg-type]
                       dry_run=bool(r.dry_run))
        for r in rems
    }


def latest_healthy(
    session: Session, nodes: Iterable[str], since: datetime, slurm_bad: frozenset[str]
) -> dict[str, dict[Condition, datetime]]:
    """Per node, the latest healthy observation of each condition recorded at or after ``since``
    (see :func:`remediation.domain.attribution.healthy_observations`)."""
    rows = session.execute(
        select(Event.node, Event.source, Event.kind, Event.state, Event.observed_at).where(
            among(session, Event.node, nodes), Event.observed_at >= since, Event.kind.in_(("healthy", "inventory"))
        )
    ).all()
    out: dict[str, dict[Condition, datetime]] = {}
    found = healthy_observations(
        ((n, src, k, st, aware(at)) for n, src, k, st, at in rows), {"slurm": slurm_bad}  # type: ignore[misc]
    )
    for (node, cond), at in found.items():
        out.setdefault(node, {})[cond] = at
    return out


def cluster_view(session: Session, now: datetime, breaker_window: timedelta, exclude: int | None) -> ClusterView:
    pool = session.scalar(select(func.count()).select_from(Node)) or 0
    # The breaker counts real failures since the window's start or its last close, whichever is
    # later: a human's close is not undone by the storm they just looked at (remediation.services.breaker).
    controls = controls_get(session, BREAKER, LAST_VM_ACTION, PAUSED)
    latch = controls[BREAKER]
    since = now - breaker_window
    if not latch.get("open") and isinstance(latch.get("closed_at"), str):
        since = max(since, datetime.fromisoformat(latch["closed_at"]))
    real = Remediation.dry_run.is_(False)
    # A correlated incident is local and expected: its nodes are one fault, not a storm.
    failed = session.scalar(
        select(func.count(func.distinct(Remediation.node))).where(
            Remediation.opened_at > since, real, Remediation.incident_id.is_(None))
    ) or 0
    last_failure = session.scalar(select(func.max(Remediation.opened_at)).where(real))
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
    last = controls[LAST_VM_ACTION].get("at")
    pause = controls[PAUSED]
    return ClusterView(
        paused=bool(pause.get("paused")),
        pause_reason=": ".join(str(pause[k]) for k in ("by", "reason") if pause.get(k)) if pause.get("paused") else "",
        pool_size=int(pool),
        failed_in_window=int(failed),
        vm_active=int(session.scalar(in_flight) or 0),
        last_vm_action_at=aware(datetime.fromisoformat(last)) if last else None,
        breaker_latched=bool(latch.get("open")),
        breaker_reason=str(latch.get("reason") or "") if latch.get("open") else "",
        last_failure_at=aware(last_failure),
    )
