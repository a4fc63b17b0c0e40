"""Ingest: record a batch of published events and apply the domain's decision to each, in one transaction.

Per batch (not per event) the ingest makes a fixed number of round trips: one INSERT ... ON CONFLICT DO
NOTHING RETURNING for the events (the RETURNING set is exactly the events never seen before, race-free
against a concurrent ingest), one SELECT of the nodes involved, one of their open remediations, one of
their recent failure counts (episodes), two for their latest remediation (what its own actions may
explain) and one for their latest healthy observations, then the decisions, written back in one
executemany UPDATE.

Decisions are level-triggered: an unhealthy edge is decided against the node's latest observation of
the same condition, from the database *and* from the rest of the batch (a watcher may flush a stale
edge together with the healthy observation that ended it), and against the remediation that may
have caused it (:mod:`remediation.domain.attribution`). New
remediations are inserted together with ON CONFLICT DO NOTHING against the one-open-per-node index, so
losing a race to a concurrent ingest costs that one event a "record" decision, not the batch.

Payloads that do not parse, however they fail, are stored in ``rejected_events`` with the reason, and
so are events the stream may not report (:mod:`remediation.domain.admission`: a human's report, a time
beyond the clock bounds) and events a replaced leader published (:mod:`remediation.services.fencing`).
Nothing published is ever dropped silently, and nothing in one payload fails the batch. A human's
report is recorded by :func:`record` directly, never read from the stream.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import insert, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import InterfaceError, OperationalError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from remediation.db.bulk import ensure_nodes, insert_events, set_decisions, update_nodes
from remediation.db.models import OPEN_PREDICATE, AuditLog, Node, RejectedEvent, Remediation
from remediation.db.queries import (
    among,
    latest_healthy,
    latest_windows,
    open_remediations_for,
)
from remediation.domain.admission import Reportable, TimeBounds
from remediation.domain.attribution import Condition, Window, healthy_observations
from remediation.domain.causes import planned_action
from remediation.domain.context import RemediationContext
from remediation.domain.events import EventKind, NodeEvent
from remediation.domain.lemon import Failure
from remediation.domain.policy import (
    Clock,
    Decision,
    DecisionKind,
    NodeView,
    decide,
    slurm_bad_states,
)
from remediation.domain.profiles import Governance, Resolution, govern, label_keys
from remediation.domain.statemachine import NodeStatus, RemediationStatus, Step
from remediation.domain.states import AuditAction
from remediation.services.audit import would
from remediation.services.dedupe import taken_by_others, unique_by_key
from remediation.services.fencing import fence_events
from remediation.services.incidents import correlate_opened, record_domains
from remediation.services.payloads import admit_events, parse_payloads, reject
from remediation.services.pool import confirm_nodes
from remediation.services.profiles import base_only, governed, histories, record_facts
from remediation.settings import EffectivePolicy, IncidentSettings, PolicySettings
from remediation.settings.profiles import Mode

log = logging.getLogger(__name__)


@dataclass
class IngestResult:
    recorded: int = 0
    duplicates: int = 0
    rejected: int = 0
    opened: list[tuple[int, str]] = field(default_factory=list)  # (remediation id, first step)
    decisions: dict[str, int] = field(default_factory=dict)


def _dialect_insert(session: Session):  # type: ignore[no-untyped-def]
    return postgresql.insert if session.get_bind().dialect.name == "postgresql" else sqlite.insert


def ingest(
    session: Session, payloads: Sequence[str | bytes], policy: PolicySettings, clock: Clock,
    dry_run: bool = False, incidents: IncidentSettings | None = None, max_bytes: int | None = None,
    gpu_reset: bool = False, governance: Governance | None = None, *, bounds: TimeBounds | None = None,
    counters: Mapping[str, int] | None = None,
) -> IngestResult:
    """Record and decide a batch read from the stream. The caller owns the transaction (commit after,
    then enqueue). Every payload that is not an event the stream may report is kept in
    ``rejected_events`` with the reason, and the rest of the batch goes on.
    ``dry_run``: the service runs in dry-run; what it opens is marked so (never counted: honest dry-run).
    ``incidents``: the correlated-incident rule (defaults when not given; see services.incidents).
    ``max_bytes``: a larger payload is rejected (``broker.max_event_bytes``; None: no limit).
    ``gpu_reset``: a job can run on a node (``validation.runs_jobs``), so a gpu-reset rung is planned.
    ``governance``: the profiles; each node is decided under its profile's policy, and what opens records
    its profile and that policy. Without it, every node is under ``policy`` and nothing is recorded (the
    workflow then reads today's configuration).
    ``bounds``: how far timestamps may be from ``clock`` (``broker.max_clock_skew_s``,
    ``broker.max_event_age_s``); None takes them as written (a rehearsal's simulated clock).
    ``counters``: each leader lock's fencing-token counter, read from Redis after the batch was (None:
    tokens are checked only against each other, :mod:`remediation.services.fencing`)."""
    now = clock.now()
    parsed, rejected = parse_payloads(payloads, max_bytes)
    events, refused = admit_events(parsed, now, bounds, counters, reportable(incidents, governance))
    events, fenced = fence_events(session, events, now)  # what a replaced leader published
    return record(session, events, policy, clock, dry_run, incidents, gpu_reset, governance,
                  rejected=rejected + refused + fenced)


def reportable(incidents: IncidentSettings | None, governance: Governance | None) -> Reportable:
    """The facts the watchers may report under this configuration (what it was not given: unchecked)."""
    return Reportable(
        label_domains=frozenset(incidents.label_keys) if incidents is not None else None,
        profile_labels=frozenset(label_keys(governance.profiles)) if governance is not None else None,
    )


def record(
    session: Session, events: Sequence[NodeEvent], policy: PolicySettings, clock: Clock,
    dry_run: bool = False, incidents: IncidentSettings | None = None, gpu_reset: bool = False,
    governance: Governance | None = None, *, rejected: Sequence[tuple[str, str]] = (),
) -> IngestResult:
    """Record and decide events already admitted: the stream's, after :func:`ingest` checked them, or a
    human's report, built by the lever that recorded its actor (never read from the stream).
    ``rejected``: (payload, why) of what the batch refused, kept in ``rejected_events``."""
    now = clock.now()
    result = IngestResult()
    if rejected:
        session.execute(
            insert(RejectedEvent),
            [{"received_at": now, "payload": p, "error": e} for p, e in rejected],
        )
        result.rejected = len(rejected)
    if not events:
        return result
    # Within one batch the same key may appear twice (edge + resync); keep the first.
    unique, result.duplicates = unique_by_key(events)

    _ensure_nodes(session, {ev.node for ev in unique.values()}, now)
    confirm_nodes(session, unique.values(), now)  # a resync's re-sent inventory confirms too
    new_keys = insert_events(session, [_event_row(ev) for ev in unique.values()], now)
    if rekeyed := taken_by_others(session, [ev for key, ev in unique.items() if key not in new_keys]):
        unique.update((ev.dedupe_key, ev) for ev in rekeyed)  # a key sent ahead hides no real edge
        new_keys.update(insert_events(session, [_event_row(ev) for ev in rekeyed], now))
    result.duplicates += len(unique) - len(rekeyed) - len(new_keys)
    fresh = sorted(
        (ev for key, ev in unique.items() if key in new_keys), key=lambda e: e.observed_at
    )
    result.recorded = len(fresh)
    if not fresh:
        return result
    record_domains(session, fresh, now)
    record_facts(session, fresh)

    names = {ev.node for ev in fresh}
    # The batch's nodes, locked until commit, as plain rows: written back in one UPDATE at the end
    # (ORM objects would flush one statement shape per changed-column set, hundreds per batch).
    nodes = {
        name: LockedNode(name, status, reason, updated, last)
        for name, status, reason, updated, last in session.execute(
            select(Node.name, Node.status, Node.status_reason, Node.updated_at, Node.last_event_at)
            .where(among(session, Node.name, names)).with_for_update()
        )
    }
    open_by_node = open_remediations_for(session, names)
    gov = governed(session, governance or Governance(base_only(policy, incidents)), names)
    past = histories(session, {name: eff for name, (_, eff) in gov.items()}, now)
    failures, app_xids, history = past.failures, past.app_xids, past.history
    windows = latest_windows(session, names)
    healthy = _healthy(session, fresh, unique.values(), policy)
    counts: dict[str, int] = defaultdict(int)
    updates: list[dict[str, Any]] = []
    failed_now: set[str] = set()  # nodes whose remediation opened in this batch (incident candidates)
    by_policy: dict[tuple[str | None, bool], tuple[EffectivePolicy, set[str]]] = {}  # ... by profile, dry-run
    todo = fresh
    while todo:
        # One round decides every event up to (and including) the first one that opens a remediation
        # on its node; the node's later events wait for the next round, when the new remediation has
        # its id. All of a round's remediations are inserted together.
        deferred: list[NodeEvent] = []
        opens: dict[str, tuple[NodeEvent, Decision]] = {}
        for ev in todo:
            if ev.node in opens:
                deferred.append(ev)
                continue
            node = nodes[ev.node]
            view = NodeView(NodeStatus(node.status), open_by_node.get(ev.node), failures.get(ev.node, 0),
                            windows.get(ev.node), healthy.get(ev.node, {}), app_xids.get(ev.node, 0),
                            history.get(ev.node, ()))
            decision = govern(decide(ev, view, gov[ev.node][1].policy), gov[ev.node][1])
            node.last_event_at = ev.observed_at
            if decision.kind is DecisionKind.APP_XID:
                app_xids[ev.node] = app_xids.get(ev.node, 0) + 1
            if decision.kind in (DecisionKind.OPEN, DecisionKind.QUARANTINE):
                opens[ev.node] = (ev, decision)
                continue
            _apply_record(ev, node, decision, now)
            counts[decision.kind] += 1
            updates.append(_decided(new_keys[ev.dedupe_key], decision, decision.remediation))
        opened = _open(session, opens, new_keys, now, dry_run, gov, gpu_reset, record=governance is not None)
        for name, (ev, decision) in opens.items():
            rid = opened.get(name)
            if rid is None:  # a concurrent ingest opened one first: this event is recorded only
                decision = Decision(DecisionKind.RECORD, "a remediation was opened concurrently")
                open_by_node.update(open_remediations_for(session, [name]))
            else:
                open_by_node[name] = rid
                dry = dry_run or gov[name][1].mode == Mode.SHADOW
                windows[name] = Window(rid, now, dry_run=dry)
                failures[name] = failures.get(name, 0) + 1
                if not dry:
                    cls = decision.cause.fault_class if decision.cause else None
                    history[name] = [*history.get(name, ()), Failure(ev.observed_at, cls)]
                node = nodes[name]
                node.status, node.status_reason, node.updated_at = NodeStatus.REMEDIATING, decision.reason, now
                first = Step.QUARANTINE if decision.kind is DecisionKind.QUARANTINE else Step.SLURM_DRAIN
                result.opened.append((rid, first.value))
                failed_now.add(name)  # a quarantine decided on this failure too: an incident may take it back
                by_policy.setdefault((gov[name][1].profile, dry), (gov[name][1], set()))[1].add(name)
            counts[decision.kind] += 1
            updates.append(_decided(new_keys[ev.dedupe_key], decision, rid))
        todo = deferred
    set_decisions(session, updates)
    update_nodes(session, [
        {"name": n.name, "status": n.status, "status_reason": n.status_reason, "updated_at": n.updated_at,
         "last_event_at": n.last_event_at} for n in nodes.values()
    ])
    for (_, dry), (eff, opened_here) in by_policy.items():  # each profile's incident rule (K, F), on its nodes
        correlate_opened(session, opened_here, eff.incidents, "remediation", now, dry)
    result.decisions = dict(counts)
    return result


@dataclass(slots=True)
class LockedNode:
    """One locked ``nodes`` row as the batch changes it (status and last event)."""

    name: str
    status: str
    status_reason: str
    updated_at: datetime
    last_event_at: datetime | None


def _healthy(session: Session, fresh: list[NodeEvent], batch: Iterable[NodeEvent],
             policy: PolicySettings) -> dict[str, dict[Condition, datetime]]:
    """The latest healthy observation per node and condition, at or after the oldest unhealthy edge
    of the batch: recorded ones and the batch's own (a later event in the batch counts too)."""
    edges = [ev.observed_at for ev in fresh if ev.kind is EventKind.UNHEALTHY]
    if not edges:
        return {}
    bad = slurm_bad_states(policy)
    names = {ev.node for ev in fresh if ev.kind is EventKind.UNHEALTHY}
    out = latest_healthy(session, names, min(edges), bad)
    mine = healthy_observations(
        ((ev.node, ev.source.value, ev.kind.value, ev.state, ev.observed_at) for ev in batch if ev.node in names),
        {"slurm": bad},
    )
    for (node, cond), at in mine.items():
        seen = out.setdefault(node, {})
        if cond not in seen or at > seen[cond]:
            seen[cond] = at
    return out


def _decided(event_id: int, decision: Decision, rid: int | None) -> dict[str, Any]:
    return {"id": event_id, "decision": decision.kind.value, "decision_reason": decision.reason[:2000],
            "remediation_id": rid}


def _apply_record(ev: NodeEvent, node: LockedNode, decision: Decision, now: datetime) -> None:
    if decision.kind is DecisionKind.RECOVERED:
        node.status, node.status_reason, node.updated_at = NodeStatus.HEALTHY, decision.reason, now
    elif (ev.kind is EventKind.UNHEALTHY and node.status == NodeStatus.HEALTHY
          and decision.kind in (DecisionKind.RECORD, DecisionKind.APP_XID) and not decision.our_own):
        node.status, node.status_reason, node.updated_at = NodeStatus.UNHEALTHY, decision.reason, now


def _open(session: Session, opens: dict[str, tuple[NodeEvent, Decision]], event_ids: dict[str, int],
          now: datetime, dry_run: bool, gov: dict[str, tuple[Resolution, EffectivePolicy]],
          gpu_reset: bool = False, record: bool = True) -> dict[str, int]:
    """Insert a round's remediations at once. The partial unique index (one open per node) is the
    arbiter against a concurrent ingest: a conflicting row is skipped, not an error."""
    if not opens:
        return {}
    rows = []
    dry: dict[str, bool] = {}
    for name, (ev, decision) in opens.items():
        profile, eff = gov[name]
        dry[name] = dry_run or eff.mode == Mode.SHADOW
        quarantine = decision.kind is DecisionKind.QUARANTINE
        cause = decision.cause
        # Quarantined on this failure (N-in-W, the lemon score): an incident that takes the failure in
        # within incidents.vm_grace_s takes the quarantine back (services.incidents).
        context = RemediationContext(
            event_state=ev.state, reason=ev.reason, observed_at=ev.observed_at.isoformat(),
            fault_class=cause.fault_class if cause is not None else None,
            gpu_pci=cause.gpu_pci if cause is not None else None,
            quarantine_reason=decision.reason if quarantine else None, quarantine_decided=True if quarantine else None,
        )
        rows.append({
            "node": name, "cause": decision.reason, "source": ev.source.value,
            "status": RemediationStatus.RUNNING.value,
            "step": (Step.QUARANTINE if quarantine else Step.SLURM_DRAIN).value, "ladder": 0,
            "opened_at": now, "updated_at": now, "next_run_at": now, "event_id": event_ids[ev.dedupe_key],
            "context": context.dump(), "dry_run": dry[name],
            "fault_class": cause.fault_class if cause else None, "fault_evidence": cause.evidence if cause else None,
            "action": "quarantine" if quarantine else planned_action(cause, eff.policy.faults, gpu_reset=gpu_reset),
            "profile": profile.name, "policy": eff.dump() if record else None,
        })
    ins = _dialect_insert(session)(Remediation).on_conflict_do_nothing(
        index_elements=["node"], index_where=OPEN_PREDICATE
    )
    opened = {node: rid for rid, node in session.execute(ins.returning(Remediation.id, Remediation.node), rows)}
    session.execute(insert(AuditLog), [
        {"at": now, "actor": "remediation", "action": AuditAction.OPEN, "target": name,
         "reason": would(opens[name][1].reason) if dry[name] else opens[name][1].reason,
         "detail": {"remediation": rid, **({"profile": gov[name][0].name} if gov[name][0].name else {})},
         "dry_run": dry[name]} for name, rid in opened.items()
    ])
    return opened


def _event_row(ev: NodeEvent) -> dict[str, object]:
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
    }


def _ensure_nodes(session: Session, names: set[str], now: datetime) -> None:
    """Watchers observe real nodes, so an event's node joins the inventory (and the breaker's pool)."""
    ensure_nodes(session, sorted(names), NodeStatus.HEALTHY.value, now)


def ingest_batch(
    sessions: sessionmaker[Session], payloads: Sequence[str | bytes], policy: PolicySettings, clock: Clock,
    dry_run: bool = False, incidents: IncidentSettings | None = None, max_bytes: int | None = None,
    gpu_reset: bool = False, governance: Governance | None = None, *, bounds: TimeBounds | None = None,
    counters: Mapping[str, int] | None = None,
) -> IngestResult:
    """Record a batch in one transaction; if the database refuses it for its *content* (a data error,
    not an outage), record the payloads one by one and keep any that still fail in rejected_events.
    One poisonous payload therefore costs one row, never the stream behind it. Outages
    (OperationalError, InterfaceError) propagate: nothing is acknowledged and the batch is retried."""
    try:
        with sessions() as s, s.begin():
            return ingest(s, payloads, policy, clock, dry_run, incidents, max_bytes, gpu_reset, governance,
                          bounds=bounds, counters=counters)
    except (OperationalError, InterfaceError):
        raise
    except SQLAlchemyError:
        pass
    total = IngestResult()
    for payload in payloads:
        try:
            with sessions() as s, s.begin():
                one = ingest(s, [payload], policy, clock, dry_run, incidents, max_bytes, gpu_reset, governance,
                             bounds=bounds, counters=counters)
        except (OperationalError, InterfaceError):
            raise
        except SQLAlchemyError as exc:
            with sessions() as s, s.begin():
                reject(s, payload, f"could not be recorded: {str(getattr(exc, 'orig', exc)).splitlines()[0]}",
                       clock.now())
            total.rejected += 1
            continue
        total.recorded += one.recorded
        total.duplicates += one.duplicates
        total.rejected += one.rejected
        total.opened += one.opened
        for k, v in one.decisions.items():
            total.decisions[k] = total.decisions.get(k, 0) + v
    return total
