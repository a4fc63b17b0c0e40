"""On-call read models: the queries behind the CLI, the JSON API and the dashboard.

Functions take a session and plain arguments and return plain dataclasses (the rows are in
:mod:`remediation.services.read_rows`; import them from here); :func:`jsonable` makes them JSON, and the
API uses them as response models. Queries are bounded. Bad input raises :class:`ReadModelError` or
:class:`RecordNotFound`, one readable sentence. ``stats`` lives in :mod:`remediation.services.stats`.

Why: docs/architecture.md#one-lever-service-one-set-of-read-models
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from remediation.clock import aware
from remediation.db.models import AuditLog, Control, Event, Node, RejectedEvent, Remediation, RemediationStep
from remediation.db.queries import BREAKER, PAUSED, control_get
from remediation.db.scope import cluster_of, narrowed, scope_of
from remediation.domain.checkpoint import CheckpointRequest
from remediation.domain.controls import BreakerLatch, PauseState
from remediation.domain.episodes import episodes
from remediation.domain.statemachine import (
    CLOSED_STATUSES,
    OPEN_STATUSES,
    QUARANTINE_STATUSES,
    NodeStatus,
    RemediationStatus,
    Step,
)
from remediation.domain.states import AuditAction
from remediation.evidence_collection import service as collected
from remediation.services.lemons import lemon_scores
from remediation.services.nvlink import nvlink_row
from remediation.services.read_rows import (
    AuditRow,
    CheckpointRow,
    ClusterState,
    EventRow,
    EvidenceItemRow,
    NodeDetail,
    NodeRow,
    Overview,
    ReadModelError,
    RecordNotFound,
    RejectedRow,
    RemediationDetail,
    RemediationRow,
    StepRow,
    TimelineEntry,
    jsonable,
)
from remediation.settings import LemonSettings, PolicySettings
from remediation.validation.service import node_validations
from remediation.validation.service import summary as validation_summary

# The rows live in read_rows; callers import them, with the queries, from here.
__all__ = [
    "ago",
    "AuditRow",
    "CheckpointRow",
    "ClusterState",
    "EventRow",
    "EvidenceItemRow",
    "get_node",
    "get_remediation",
    "human_duration",
    "jsonable",
    "list_audit",
    "list_events",
    "list_nodes",
    "list_rejected",
    "list_remediations",
    "MAX_LIMIT",
    "node_detail",
    "NodeDetail",
    "NodeRow",
    "Overview",
    "overview",
    "parse_node_status",
    "parse_remediation_status",
    "QUARANTINE_ACTIONS",
    "quarantined",
    "ReadModelError",
    "RecordNotFound",
    "RejectedRow",
    "RemediationDetail",
    "RemediationRow",
    "StepRow",
    "TimelineEntry",
]

# Audit actions that change whether a node is in quarantine: its quarantine history.
QUARANTINE_ACTIONS = (AuditAction.QUARANTINE, AuditAction.REMEDIATION_QUARANTINED, AuditAction.RELEASE,
                      AuditAction.RELEASE_DONE)
MAX_LIMIT = 1000


# ------------------------------------------------------------------------------------ validation


def parse_node_status(value: str | None) -> NodeStatus | None:
    if value is None or value == "":
        return None
    try:
        return NodeStatus(value.lower())
    except ValueError:
        raise ReadModelError(
            f"unknown node status {value!r} (choose from {', '.join(s.value for s in NodeStatus)})"
        ) from None


#: The status filter's words for a group of statuses, beside the statuses themselves.
STATUS_GROUPS: dict[str, frozenset[RemediationStatus]] = {"open": OPEN_STATUSES, "closed": CLOSED_STATUSES}


def parse_remediation_status(value: str | None) -> frozenset[str] | None:
    """A remediation status, or ``open`` (running + waiting) / ``closed``."""
    if value is None or value == "":
        return None
    v = value.lower()
    if v in STATUS_GROUPS:
        return frozenset(STATUS_GROUPS[v])
    try:
        return frozenset({RemediationStatus(v)})
    except ValueError:
        choices = ", ".join([*STATUS_GROUPS, *(s.value for s in RemediationStatus)])
        raise ReadModelError(f"unknown remediation status {value!r} (choose from {choices})") from None


def _limit(limit: int) -> int:
    if limit < 1 or limit > MAX_LIMIT:
        raise ReadModelError(f"limit must be between 1 and {MAX_LIMIT} (got {limit})")
    return limit


# ----------------------------------------------------------------------------------- converters


def _seconds(start: datetime | None, end: datetime | None) -> float | None:
    if start is None or end is None:
        return None
    return round((aware(end) - aware(start)).total_seconds(), 3)


def _event(e: Event) -> EventRow:
    return EventRow(
        id=e.id, observed_at=aware(e.observed_at), received_at=aware(e.received_at),
        source=e.source, node=e.node, kind=e.kind, state=e.state, reason=e.reason,
        reason_user=e.reason_user, decision=e.decision, decision_reason=e.decision_reason,
        remediation_id=e.remediation_id, cluster=e.cluster,
    )


def _step(r: RemediationStep) -> StepRow:
    return StepRow(
        id=r.id, step=r.step, attempt=r.attempt, status=r.status, started_at=aware(r.started_at),
        finished_at=aware(r.finished_at), duration_s=_seconds(r.started_at, r.finished_at),
        checks=r.checks, retries=r.retries, outcome=r.outcome, error=r.error, error_kind=r.error_kind,
        provider_op=dict(r.provider_op) if r.provider_op else None,
    )


def _rem_fields(r: Remediation) -> dict[str, Any]:
    return dict(
        id=r.id, node=r.node, status=r.status, step=r.step, cause=r.cause, source=r.source,
        ladder=r.ladder, opened_at=aware(r.opened_at), updated_at=aware(r.updated_at),
        closed_at=aware(r.closed_at), next_run_at=aware(r.next_run_at),
        duration_s=_seconds(r.opened_at, r.closed_at), wait_reason=r.wait_reason, outcome=r.outcome,
        fault_class=r.fault_class, fault_evidence=r.fault_evidence, action=r.action, profile=r.profile,
        dry_run=bool(r.dry_run), cluster=r.cluster,
    )


def _audit(a: AuditLog) -> AuditRow:
    return AuditRow(id=a.id, at=aware(a.at), actor=a.actor, action=a.action, target=a.target,
                    reason=a.reason, detail=dict(a.detail or {}), via=a.via,
                    cluster=a.cluster)


def _node(n: Node, rem: Remediation | None) -> NodeRow:
    return NodeRow(
        name=n.name, status=n.status, status_reason=n.status_reason, updated_at=aware(n.updated_at),
        last_event_at=aware(n.last_event_at), quarantined_at=aware(n.quarantined_at),
        quarantine_reason=n.quarantine_reason, released_at=aware(n.released_at),
        open_remediation=rem.id if rem else None, step=rem.step if rem else None,
        wait_reason=rem.wait_reason if rem else None, profile=n.profile, cluster=n.cluster,
    )


# -------------------------------------------------------------------------------------- queries


def list_nodes(s: Session, status: str | None = None, lemon: LemonSettings | None = None,
               *, now: datetime | None = None, profile: str | None = None) -> list[NodeRow]:
    wanted = parse_node_status(status)
    q = select(Node, Remediation).outerjoin(
        Remediation, (Remediation.cluster == Node.cluster) & (Remediation.node == Node.name)
        & Remediation.status.in_(OPEN_STATUSES)
    )
    if wanted is not None:
        q = q.where(Node.status == wanted.value)
    if profile is not None:
        q = q.where(Node.profile == profile)
    rows = [_node(n, r) for n, r in s.execute(q.order_by(Node.name, Node.cluster))]
    return _with_lemon(s, rows, lemon, now=now,
                       names=None if wanted is None and profile is None else [r.name for r in rows])


def get_node(s: Session, name: str, lemon: LemonSettings | None = None, *,
             now: datetime | None = None) -> NodeRow:
    """Node ``name`` of the session's cluster (``default`` for an unscoped session: resolve the
    cluster first, :func:`remediation.services.clusters.node_cluster`)."""
    n = s.get(Node, (cluster_of(s), name))
    if n is None:
        raise RecordNotFound(f"unknown node {name!r} (see `remediation nodes list`)")
    rem = s.scalars(select(Remediation).where(
        Remediation.cluster == n.cluster, Remediation.node == name, Remediation.status.in_(OPEN_STATUSES))
    ).first()
    return _with_lemon(s, [_node(n, rem)], lemon, now=now, names=[name])[0]


def _with_lemon(s: Session, rows: list[NodeRow], lemon: LemonSettings | None, *, now: datetime | None,
                names: list[str] | None) -> list[NodeRow]:
    """Each node's lemon score and its explanation, one query a cluster (scores are by node name)."""
    clusters = sorted({row.cluster for row in rows})
    for cluster in clusters if len(clusters) > 1 or scope_of(s) is None else [None]:
        mine = [row for row in rows if cluster is None or row.cluster == cluster]
        wanted = None if names is None else [row.name for row in mine]
        if cluster is None:
            scores = lemon_scores(s, now or datetime.now(UTC), lemon or LemonSettings(), nodes=wanted)
        else:
            with narrowed(s, cluster):
                scores = lemon_scores(s, now or datetime.now(UTC), lemon or LemonSettings(), nodes=wanted)
        for row in mine:
            if (sc := scores.get(row.name)) is not None:
                row.lemon_score, row.lemon = sc.score, sc.explanation
    return rows


def list_events(s: Session, node: str | None = None, after_id: int | None = None,
                *, limit: int = 50) -> list[EventRow]:
    """The newest ``limit`` events (after ``after_id`` when following), returned oldest first."""
    q = select(Event)
    if node:
        q = q.where(Event.node == node)
    if after_id is not None:
        q = q.where(Event.id > after_id).order_by(Event.id).limit(_limit(limit))
        return [_event(e) for e in s.scalars(q)]
    rows = s.scalars(q.order_by(Event.id.desc()).limit(_limit(limit))).all()
    return [_event(e) for e in reversed(rows)]


def list_remediations(s: Session, status: str | None = None, node: str | None = None,
                      *, limit: int = 100, profile: str | None = None) -> list[RemediationRow]:
    wanted = parse_remediation_status(status)
    q = select(Remediation)
    if wanted is not None:
        q = q.where(Remediation.status.in_(sorted(wanted)))
    if node:
        q = q.where(Remediation.node == node)
    if profile is not None:
        q = q.where(Remediation.profile == profile)
    rows = s.scalars(q.order_by(Remediation.id.desc()).limit(_limit(limit)))
    return [RemediationRow(**_rem_fields(r)) for r in rows]


def get_remediation(s: Session, remediation_id: int) -> RemediationDetail:
    r = s.get(Remediation, remediation_id)
    if r is None:
        raise RecordNotFound(f"no remediation #{remediation_id} (see `remediation remediations list`)")
    ev = s.get(Event, r.event_id) if r.event_id is not None else None
    kept = collected.items(s, r.id)
    return RemediationDetail(**_rem_fields(r), context=dict(r.context or {}), policy=r.policy,
                             steps=[_step(x) for x in r.steps], event=_event(ev) if ev else None,
                             evidence_items=kept, evidence_note=None if kept else collected.note(s, r.id))


def list_audit(s: Session, target: str | None = None, action: str | None = None,
               *, limit: int = 100) -> list[AuditRow]:
    q = select(AuditLog)
    if target:
        q = q.where(AuditLog.target == target)
    if action:
        if action not in frozenset(AuditAction):
            return []  # no row holds an action outside the vocabulary
        q = q.where(AuditLog.action == AuditAction(action))
    return [_audit(a) for a in s.scalars(q.order_by(AuditLog.id.desc()).limit(_limit(limit)))]


def list_rejected(s: Session, limit: int = 50) -> list[RejectedRow]:
    rows = s.scalars(select(RejectedEvent).order_by(RejectedEvent.id.desc()).limit(_limit(limit)))
    return [RejectedRow(id=r.id, received_at=aware(r.received_at), error=r.error,
                        payload=r.payload[:2000], cluster=r.cluster) for r in rows]


def quarantined(s: Session) -> list[NodeRow]:
    """Every node kept out of the pool: quarantined, or quarantined with a repair request open."""
    rows = [row for st in (NodeStatus.QUARANTINED, NodeStatus.WITH_REPAIR) for row in list_nodes(s, st.value)]
    return sorted(rows, key=lambda r: (r.name, r.cluster))


def node_detail(s: Session, name: str, limit: int = 200, *, policy: PolicySettings | None = None,
                now: datetime | None = None) -> NodeDetail:
    """Everything on-call needs about one node, newest first in each list and merged into one
    timeline (oldest first, the way a story reads), and its fault episodes with their evidence
    (settle period and window from ``policy``). The node of the session's cluster: an unscoped session
    reads ``default``'s (:func:`remediation.services.clusters.node_cluster` says which to scope to)."""
    if scope_of(s) is None:
        with narrowed(s, cluster_of(s)):
            return node_detail(s, name, limit, policy=policy, now=now)
    policy = policy or PolicySettings()
    node = get_node(s, name, policy.lemon, now=now)
    rem_ids = s.scalars(
        select(Remediation.id).where(Remediation.node == name).order_by(Remediation.opened_at.desc())
        .limit(_limit(limit))
    ).all()
    rems = [get_remediation(s, rid) for rid in rem_ids]
    events = list(reversed(list_events(s, node=name, limit=limit)))
    audit_rows = list_audit(s, target=name, limit=limit)
    history = [a for a in audit_rows if a.action in QUARANTINE_ACTIONS]
    found = episodes(rems, events, now or datetime.now(UTC), settle=timedelta(seconds=policy.settle_s),
                     window=policy.repeat_offender_window, released_at=node.released_at)
    return NodeDetail(node=node, remediations=rems, events=events, quarantine_history=history,
                      audit=audit_rows, timeline=_timeline(rems, events, audit_rows), episodes=found,
                      validations=node_validations(s, name), checkpoint=_checkpoint(s, node, now or datetime.now(UTC)),
                      nvlink=nvlink_row(s, name))


def _checkpoint(s: Session, node: NodeRow, now: datetime) -> CheckpointRow | None:
    """The checkpoint request the node's drain (jobs) or eviction (pods) waits on (None: none, or
    that step is over)."""
    if node.open_remediation is None or node.step not in (Step.SLURM_DRAIN, Step.K8S_EVICT):
        return None
    row = s.scalars(select(RemediationStep).where(
        RemediationStep.remediation_id == node.open_remediation, RemediationStep.step == node.step,
    ).order_by(RemediationStep.attempt.desc()).limit(1)).first()
    request = CheckpointRequest.load(row.provider_op) if row is not None else None
    if row is None or request is None or not request.jobs:
        return None
    return CheckpointRow(list(request.jobs), request.signal, request.scope, request.at, request.wait_s,
                         request.sent, bool(row.dry_run), request.text(now, dry_run=bool(row.dry_run)),
                         request.target)


def _timeline(rems: list[RemediationDetail], events: list[EventRow],
              audit_rows: list[AuditRow]) -> list[TimelineEntry]:
    out: list[TimelineEntry] = []
    for e in events:
        out.append(TimelineEntry(e.observed_at, "event", f"{e.source} {e.kind} {e.state}",
                                 f"{e.reason} → {e.decision or 'pending'}: {e.decision_reason}".strip(),
                                 e.remediation_id, status=e.decision))
    for r in rems:
        out.append(TimelineEntry(r.opened_at, "remediation", f"remediation #{r.id} opened", r.cause, r.id,
                                 status="running"))
        for st in r.steps:
            title = f"#{r.id} {st.step}" + (f" (attempt {st.attempt})" if st.attempt > 1 else "")
            out.append(TimelineEntry(st.started_at, "step", title, st.outcome or "", r.id, st.duration_s,
                                     st.error, st.status))
        if r.closed_at is not None:
            out.append(TimelineEntry(r.closed_at, "remediation", f"remediation #{r.id} {r.status}",
                                     r.outcome or "", r.id, r.duration_s, status=r.status))
    for a in audit_rows:
        if a.action == AuditAction.OPEN or AuditAction(a.action).closes_a_remediation:
            continue  # already told by the remediation rows above
        out.append(TimelineEntry(a.at, "audit", f"{a.action} by {a.actor}", a.reason,
                                 a.detail.get("remediation"), status=a.action))
    out.sort(key=lambda t: (t.at, {"event": 0, "remediation": 1, "step": 2, "audit": 3}[t.kind]))
    return out


def overview(s: Session) -> Overview:
    by_node = {st.value: 0 for st in NodeStatus}
    for status, n in s.execute(select(Node.status, func.count()).group_by(Node.status)):
        by_node[status] = int(n)
    by_rem = {st.value: 0 for st in RemediationStatus}
    for rstatus, n in s.execute(select(Remediation.status, func.count()).group_by(Remediation.status)):
        by_rem[rstatus] = int(n)
    paused, breaker = _controls(s, PAUSED), _controls(s, BREAKER)
    return Overview(
        nodes_by_status=by_node, remediations_by_status=by_rem,
        in_flight=sum(by_rem[st.value] for st in OPEN_STATUSES),
        quarantined=sum(by_node.get(st.value, 0) for st in QUARANTINE_STATUSES),
        paused=bool(PauseState.load(paused).paused), paused_detail=paused,
        breaker_open=bool(BreakerLatch.load(breaker).open), breaker_detail=breaker,
        last_event_at=aware(s.scalar(select(func.max(Event.observed_at)))),
        validation=(checked := validation_summary(s)),
        gate=checked,
    )


def _controls(s: Session, key: str) -> dict[str, Any]:
    """Control row ``key`` of the session's cluster; unscoped, the first cluster's (by name) that is
    set (paused, latched open), each naming its cluster: the fleet is paused where any cluster is."""
    if scope_of(s) is not None:
        return control_get(s, key)
    rows = s.execute(select(Control.cluster, Control.value).where(Control.key == key).order_by(Control.cluster)).all()
    if len(rows) == 1 and rows[0][0] == cluster_of(s):
        return dict(rows[0][1] or {})
    for cluster, value in rows:
        if (value or {}).get("paused") or (value or {}).get("open"):
            return {**value, "cluster": cluster}
    return {}


# ----------------------------------------------------------------------------------- formatting


def ago(at: datetime | None, now: datetime) -> str:
    """"3m ago" / "in 20s": the form a tired reader parses fastest."""
    if at is None:
        return "-"
    secs = (now - aware(at)).total_seconds()
    text = human_duration(abs(secs))
    return f"{text} ago" if secs >= 0 else f"in {text}"


def human_duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(round(seconds))
    if s < 60:
        return f"{s}s" if s or seconds == 0 else f"{seconds:.1f}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{(s % 3600) // 60:02d}m"
    return f"{s // 86400}d{(s % 86400) // 3600:02d}h"
