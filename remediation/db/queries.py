"""The reads the domain needs, each one query, shared by ingest, the workflow and on-call views.

Kept apart from the models so that the SQL that serves the hot path (ingest, admission) is easy to find
and to index for: nodes by name, remediations by (node, opened_at) and (status, next_run_at).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Select, String, and_, any_, bindparam, case, false, func, or_, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.orm import Session, aliased, lazyload

from remediation.clock import aware
from remediation.db.models import Control, DomainRepair, Event, Node, Remediation, RemediationStep
from remediation.db.scope import cluster_of
from remediation.domain.attribution import Condition, Window, healthy_observations
from remediation.domain.controls import BreakerLatch, LastMachineAction, PauseState
from remediation.domain.events import EventKind
from remediation.domain.policy import ClusterView
from remediation.domain.statemachine import OPEN_STATUSES, RemediationStatus, Step
from remediation.domain.states import LIVE_STEP_STATUSES
from remediation.domain_repair.rules import MACHINE_STEPS, DomainRepairStatus

PAUSED = "paused"
BREAKER = "breaker"
LAST_MACHINE_ACTION = "last_vm_action"


def control_get(session: Session, key: str) -> dict[str, Any]:
    """Control row ``key`` of the session's cluster (an unscoped session's: ``default``)."""
    value = session.execute(select(Control.value).where(Control.cluster == cluster_of(session),
                                                        Control.key == key)).scalar_one_or_none()
    return dict(value) if value else {}


def control_set(session: Session, key: str, value: dict[str, Any], *, now: datetime) -> None:
    """Upsert: two workers noticing the same change at once must not collide on the key."""
    dialect = session.get_bind().dialect.name
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    stmt = insert(Control).values(cluster=cluster_of(session), key=key, value=value, updated_at=now)
    session.execute(stmt.on_conflict_do_update(index_elements=["cluster", "key"],
                                               set_={"value": value, "updated_at": now}))


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
    s.execute(_ENSURE_CONTROL[s.get_bind().dialect.name == "postgresql"],
              {"cluster": cluster_of(s), "key": key, "value": {}, "now": now})
    value = s.execute(_CONTROL_LOCKED, {"cluster": cluster_of(s), "key": key}).scalar_one()
    return dict(value or {})


# Built once: every VM admission and every correlation takes this lock.
_ENSURE_CONTROL = {
    postgres: (postgresql.insert if postgres else sqlite.insert)(Control)
    .values(cluster=bindparam("cluster"), key=bindparam("key"), value=bindparam("value", type_=Control.value.type),
            updated_at=bindparam("now"))
    .on_conflict_do_nothing(index_elements=["cluster", "key"])
    for postgres in (False, True)
}
_CONTROL_LOCKED = select(Control.value).where(
    Control.cluster == bindparam("cluster"), Control.key == bindparam("key")).with_for_update()


# A remediation's own row, locked, without its steps (lazy="selectin" would load them all): the claim and
# the record of every step read it, so the statement is built once rather than by ``Session.get``.
_REMEDIATION_LOCKED = (
    select(Remediation).options(lazyload(Remediation.steps)).where(Remediation.id == bindparam("id")).with_for_update()
)
_STEP_ROW = select(RemediationStep).where(RemediationStep.id == bindparam("id"))


def remediation_locked(session: Session, rid: int) -> Remediation | None:
    """The remediation's row, locked until the transaction ends (its steps are not loaded)."""
    return session.scalars(_REMEDIATION_LOCKED, {"id": rid}).first()


def step_row(session: Session, row_id: int) -> RemediationStep | None:
    return session.scalars(_STEP_ROW, {"id": row_id}).first()


def is_paused(session: Session) -> bool:
    return bool(PauseState.load(control_get(session, PAUSED)).paused)


def open_remediations_for(session: Session, nodes: Iterable[str]) -> dict[str, int]:
    rows = session.execute(
        select(Remediation.node, Remediation.id).where(
            among(session, Remediation.node, nodes), Remediation.status.in_(OPEN_STATUSES)
        )
    )
    return {node: rid for node, rid in rows}


def recent_failure_counts(
    session: Session, nodes: Iterable[str], now: datetime, *, window: timedelta
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
            Remediation.dry_run.is_(False),  # dry-run history never counts (honest dry-run)
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
        select(Remediation.id, Remediation.node, Remediation.opened_at, Remediation.closed_at, Remediation.dry_run,
               Remediation.step, Remediation.status)
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
        r.node: Window(r.id, aware(r.opened_at), aware(r.closed_at), aware(vm_at.get(r.id)),
                       dry_run=bool(r.dry_run),
                       quarantined=r.step == Step.QUARANTINE or r.status == RemediationStatus.QUARANTINED)
        for r in rems
    }


def latest_healthy(
    session: Session, nodes: Iterable[str], since: datetime, *, slurm_bad: frozenset[str]
) -> dict[str, dict[Condition, datetime]]:
    """Per node, the latest healthy observation of each condition recorded at or after ``since``
    (see :func:`remediation.domain.attribution.healthy_observations`)."""
    rows = session.execute(
        select(Event.node, Event.source, Event.kind, Event.state, Event.observed_at).where(
            among(session, Event.node, nodes), Event.observed_at >= since,
            Event.kind.in_((EventKind.HEALTHY, EventKind.INVENTORY)),
        )
    ).all()
    out: dict[str, dict[Condition, datetime]] = {}
    found = healthy_observations(
        ((n, src, k, st, aware(at)) for n, src, k, st, at in rows), {"slurm": slurm_bad}
    )
    for (node, cond), at in found.items():
        out.setdefault(node, {})[cond] = at
    return out


_REAL = Remediation.dry_run.is_(False)


def _control_value(key: str) -> Any:
    return select(Control.value).where(Control.cluster == bindparam("cluster"), Control.key == key).scalar_subquery()


# The view's three control rows and the newest confirmation in one row: one statement, not two.
_VIEW_READS = select(_control_value(BREAKER), _control_value(LAST_MACHINE_ACTION), _control_value(PAUSED),
                     select(func.max(Node.confirmed_at)).scalar_subquery())
# One statement for the four counts admission needs, built once: admission reads the view on every claim
# and every sweep, and building five statements per read was most of a claim's cost. The pool's is the
# same, over one profile's nodes and remediations (its storm breaker and max_concurrent).
def _counts(pool: bool) -> Select[Any]:
    def mine(column: Any) -> list[Any]:
        return [column == bindparam("profile")] if pool else []

    # Until a resync has confirmed any node, every row counts (services/pool.py). Asked as a CASE on the
    # newest confirmation (one index seek), not as an OR with NOT EXISTS: SQLite scanned the whole nodes
    # table for that, on every claim, a cost that grew with the fleet.
    ever = aliased(Node)
    never_confirmed = select(func.max(ever.confirmed_at)).scalar_subquery().is_(None)
    pool_size = case(
        (never_confirmed, select(func.count()).select_from(Node).where(*mine(Node.profile)).scalar_subquery()),
        else_=select(func.count()).select_from(Node)
        .where(Node.confirmed_at >= bindparam("confirmed_since"), *mine(Node.profile)).scalar_subquery(),
    )
    return select(
        pool_size,
        # A correlated incident is local and expected: its nodes are one fault, not a storm.
        select(func.count(func.distinct(Remediation.node)))
        .where(Remediation.opened_at > bindparam("since"), _REAL, Remediation.incident_id.is_(None),
               *mine(Remediation.profile))
        .scalar_subquery(),
        select(func.max(Remediation.opened_at)).where(_REAL, *mine(Remediation.profile)).scalar_subquery(),
        # A domain repair counts as all its trays, for the breaker and for max_concurrent (not in a
        # profile's pool: a domain has no profile).
        select(func.coalesce(func.sum(DomainRepair.size), 0)).where(
            DomainRepair.opened_at > bindparam("since"), DomainRepair.dry_run.is_(False), *_not_pooled(pool))
        .scalar_subquery(),
        select(func.coalesce(func.sum(DomainRepair.size), 0)).where(
            DomainRepair.status == DomainRepairStatus.RUNNING, DomainRepair.step.in_(list(MACHINE_STEPS)),
            DomainRepair.dry_run.is_(False), *_not_pooled(pool))
        .scalar_subquery(),
        # VM actions in flight: verifying, or restarting with the restart's step row still open (looked up
        # per open remediation through the steps' (remediation_id, step) index, not by scanning every step).
        select(func.count(Remediation.id))
        .where(
            Remediation.status.in_(OPEN_STATUSES),
            Remediation.id != bindparam("exclude"),
            *mine(Remediation.profile),
            or_(
                Remediation.step == Step.VERIFY,
                and_(
                    Remediation.step == Step.VM_RESTART,
                    select(RemediationStep.id)
                    .where(
                        RemediationStep.remediation_id == Remediation.id,
                        RemediationStep.step == Step.VM_RESTART,
                        RemediationStep.status.in_(LIVE_STEP_STATUSES),
                    )
                    .exists(),
                ),
            ),
        )
        .scalar_subquery(),
    )


def _not_pooled(pool: bool) -> list[Any]:
    return [false()] if pool else []


_VIEW_COUNTS, _POOL_COUNTS = _counts(False), _counts(True)


def breaker_key(profile: str | None) -> str:
    """The control row of the fleet's storm breaker (None), or of one profile's."""
    return BREAKER if profile is None else f"{BREAKER}:{profile}"


def confirmed_since(session: Session, pool_stale: timedelta | None) -> datetime:
    """The oldest confirmation still in the pool: ``pool_stale`` before the latest resync's. Measured
    from the latest confirmation, not from now, a node leaves only by missing resyncs the others got:
    a stopped watcher confirms nobody, and then nobody leaves (a pool of zero would disable the breaker)."""
    if pool_stale is None:
        return _EPOCH
    return _oldest_confirmed(session.scalar(select(func.max(Node.confirmed_at))), pool_stale)


def _oldest_confirmed(latest: datetime | None, pool_stale: timedelta | None) -> datetime:
    if pool_stale is None or latest is None:
        return _EPOCH
    return latest.replace(tzinfo=latest.tzinfo or UTC) - pool_stale


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def fleet_latched(session: Session, view: ClusterView) -> ClusterView:
    """``view`` held as well by every other cluster's pause and storm breaker (``cluster.fleet_latch``):
    a latch in one cluster then holds the fleet. Read across clusters from a scoped session."""
    own = cluster_of(session)
    rows = session.execute(_FLEET_CONTROLS.where(Control.cluster != own)).all()
    for cluster, key, value in sorted(rows, key=lambda row: (row[0], row[1])):
        if key == PAUSED and (pause := PauseState.load(value)).paused and not view.paused:
            view = replace(view, paused=True, pause_reason=f"cluster {cluster} paused (cluster.fleet_latch): "
                           f"{pause.why}")
        elif key == BREAKER and (latch := BreakerLatch.load(value)).open and not view.breaker_latched:
            view = replace(view, breaker_latched=True, breaker_reason=f"cluster {cluster}'s storm breaker "
                           f"(cluster.fleet_latch): {latch.reason or ''}")
    return view


_FLEET_CONTROLS = select(Control.cluster, Control.key, Control.value).where(
    Control.key.in_((BREAKER, PAUSED))).execution_options(all_clusters=True)


def cluster_view(session: Session, now: datetime, breaker_window: timedelta, *, exclude: int | None,
                 profile: str | None = None, pool_stale: timedelta | None = None) -> ClusterView:
    """The fleet's view, or with ``profile`` its pool's: the nodes it governs, its remediations, its latch.
    ``pool_stale``: a node no resync has listed for this long leaves the pool (None: none leaves)."""
    breaker_row, last_row, paused_row, latest = session.execute(_VIEW_READS, {"cluster": cluster_of(session)}).one()
    # The breaker counts real failures since the window's start or its last close, whichever is
    # later: a human's close is not undone by the storm they just looked at (remediation.services.breaker).
    latch = BreakerLatch.load(breaker_row if profile is None else control_get(session, breaker_key(profile)))
    since = now - breaker_window
    if (closed := latch.closed) is not None:
        since = max(since, closed)
    pool, failed, last_failure, trays_failed, trays_active, machine_active = session.execute(
        _VIEW_COUNTS if profile is None else _POOL_COUNTS,
        {"since": since, "exclude": exclude if exclude is not None else -1,
         "confirmed_since": _oldest_confirmed(latest, pool_stale),
         **({"profile": profile} if profile is not None else {})},
    ).one()
    last = LastMachineAction.load(last_row).when
    pause = PauseState.load(paused_row)
    return ClusterView(
        paused=bool(pause.paused),
        pause_reason=pause.why,
        pool_size=int(pool or 0),
        failed_in_window=int(failed or 0) + int(trays_failed or 0),
        machine_active=int(machine_active or 0) + int(trays_active or 0),
        last_machine_action_at=aware(last),
        breaker_latched=bool(latch.open),
        breaker_reason=(latch.reason or "") if latch.open else "",
        last_failure_at=aware(last_failure),
    )
