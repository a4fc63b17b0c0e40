"""Ingest: record a batch of published events and apply the domain's decision to each, in one transaction.

Per batch (not per event) the ingest makes a fixed number of round trips: one INSERT ... ON CONFLICT DO
NOTHING RETURNING for the events (the RETURNING set is exactly the events never seen before, race-free
against a concurrent ingest), one SELECT of the nodes involved, one of their open remediations, one of
their recent failure counts, then the decisions, written back in one executemany UPDATE. Opening a
remediation runs in a SAVEPOINT so that losing the race on the one-open-per-node index costs that one
event a "record" decision, not the batch.

Payloads that do not parse are stored in ``rejected_events`` with the parser's message. Nothing
published is ever dropped silently.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import insert, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from remediation.audit import audit
from remediation.db.models import Event, Node, RejectedEvent, Remediation
from remediation.db.queries import open_remediations_for, recent_failure_counts
from remediation.events import EventKind, InvalidEvent, NodeEvent
from remediation.policy import Clock, Decision, DecisionKind, NodeView, decide
from remediation.settings import PolicySettings
from remediation.states import NodeStatus, RemediationStatus, Step


@dataclass
class IngestResult:
    recorded: int = 0
    duplicates: int = 0
    rejected: int = 0
    opened: list[tuple[int, str]] = field(default_factory=list)  # (remediation id, first step)
    decisions: dict[str, int] = field(default_factory=dict)


def _dialect_insert(session: Session):  # type: ignore[no-untyped-def]
    return postgresql.insert if session.get_bind().dialect.name == "postgresql" else sqlite.insert


def parse_payloads(payloads: Sequence[str | bytes]) -> tuple[list[NodeEvent], list[tuple[str, str]]]:
    events: list[NodeEvent] = []
    rejected: list[tuple[str, str]] = []
    for raw in payloads:
        try:
            events.append(NodeEvent.parse(raw))
        except InvalidEvent as exc:
            text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
            rejected.append((text[:65536], str(exc)))
    return events, rejected


def ingest(
    session: Session, payloads: Sequence[str | bytes], policy: PolicySettings, clock: Clock
) -> IngestResult:
    """Record and decide a batch. The caller owns the transaction (commit after, then enqueue)."""
    now = clock.now()
    result = IngestResult()
    events, rejected = parse_payloads(payloads)
    if rejected:
        session.execute(
            insert(RejectedEvent),
            [{"received_at": now, "payload": p, "error": e} for p, e in rejected],
        )
        result.rejected = len(rejected)
    if not events:
        return result
    # Within one batch the same key may appear twice (edge + resync); keep the first.
    unique: dict[str, NodeEvent] = {}
    for ev in events:
        unique.setdefault(ev.dedupe_key, ev)
    result.duplicates = len(events) - len(unique)

    _ensure_nodes(session, {ev.node for ev in unique.values()}, now)
    ins = _dialect_insert(session)(Event).on_conflict_do_nothing(index_elements=["dedupe_key"])
    rows = [_event_row(ev, now) for ev in unique.values()]
    new_keys = {
        key: eid
        for eid, key in session.execute(ins.returning(Event.id, Event.dedupe_key), rows).all()
    }
    result.duplicates += len(unique) - len(new_keys)
    fresh = sorted(
        (ev for key, ev in unique.items() if key in new_keys), key=lambda e: e.observed_at
    )
    result.recorded = len(fresh)
    if not fresh:
        return result

    names = {ev.node for ev in fresh}
    nodes = {n.name: n for n in session.scalars(select(Node).where(Node.name.in_(names)).with_for_update())}
    open_by_node = open_remediations_for(session, names)
    failures = recent_failure_counts(session, names, now, policy.repeat_offender_window)
    counts: dict[str, int] = defaultdict(int)
    updates = []
    for ev in fresh:
        node = nodes[ev.node]
        view = NodeView(NodeStatus(node.status), open_by_node.get(ev.node), failures.get(ev.node, 0))
        decision = decide(ev, view, policy)
        rem_id = _apply(session, ev, new_keys[ev.dedupe_key], node, decision, now, result)
        if rem_id is not None:
            open_by_node[ev.node] = rem_id
            failures[ev.node] = failures.get(ev.node, 0) + 1
        counts[decision.kind] += 1
        updates.append(
            {"id": new_keys[ev.dedupe_key], "decision": decision.kind.value,
             "decision_reason": decision.reason[:2000], "remediation_id": rem_id}
        )
        node.last_event_at = ev.observed_at
    session.execute(update(Event), updates)
    result.decisions = dict(counts)
    return result


def _event_row(ev: NodeEvent, now: datetime) -> dict[str, object]:
    return {
        "dedupe_key": ev.dedupe_key,
        "source": ev.source.value,
        "node": ev.node,
        "kind": ev.kind.value,
        "state": ev.state,
        "reason": ev.reason,
        "reason_user": ev.reason_user,
        "observed_at": ev.observed_at,
        "published_at": ev.published_at,
        "received_at": now,
        "decision": "",
        "decision_reason": "",
    }


def _ensure_nodes(session: Session, names: set[str], now: datetime) -> None:
    """Watchers observe real nodes, so an event's node joins the inventory (and the breaker's pool)."""
    ins = _dialect_insert(session)(Node).on_conflict_do_nothing(index_elements=["name"])
    session.execute(
        ins,
        [{"name": n, "status": NodeStatus.HEALTHY.value, "status_reason": "", "first_seen_at": now,
          "updated_at": now} for n in sorted(names)],
    )


def _apply(
    session: Session, ev: NodeEvent, event_id: int, node: Node, decision: Decision, now: datetime,
    result: IngestResult,
) -> int | None:
    if decision.kind is DecisionKind.RECOVERED:
        node.status, node.status_reason, node.updated_at = NodeStatus.HEALTHY, decision.reason, now
        return None
    if decision.kind is DecisionKind.RECORD:
        if ev.kind is EventKind.UNHEALTHY and node.status == NodeStatus.HEALTHY:
            node.status, node.status_reason, node.updated_at = NodeStatus.UNHEALTHY, decision.reason, now
        return None
    quarantine = decision.kind is DecisionKind.QUARANTINE
    first = Step.QUARANTINE if quarantine else Step.SLURM_DRAIN
    rem = Remediation(
        node=ev.node, cause=decision.reason if quarantine else decision.reason, source=ev.source.value,
        status=RemediationStatus.RUNNING, step=first, ladder=0, opened_at=now, updated_at=now,
        next_run_at=now, event_id=event_id, context={"event_state": ev.state, "reason": ev.reason},
    )
    try:
        with session.begin_nested():
            session.add(rem)
            session.flush()
    except IntegrityError:
        return None  # a concurrent ingest opened one first; this event is recorded only
    node.status = NodeStatus.REMEDIATING
    node.status_reason = decision.reason
    node.updated_at = now
    audit(session, now, "remediation", "open", ev.node, decision.reason, {"remediation": rem.id})
    result.opened.append((rem.id, first.value))
    return rem.id
