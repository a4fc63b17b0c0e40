"""Ingest: record a batch of published events and apply the domain's decision to each, in one transaction.

A batch takes a fixed number of round trips, however many events. Decisions are level-triggered:
each unhealthy edge is judged against the node's latest observations (in the database and the rest of
the batch) and the remediation that may have caused it. Payloads that fail to parse, are not
admitted, or were fenced go to ``rejected_events``. A human's report is recorded by :func:`record`,
never read from the stream.

Why: docs/architecture.md#the-ingest-writes-a-batch-as-one-statement
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import insert
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import InterfaceError, OperationalError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from remediation.db.bulk import ensure_nodes, insert_events
from remediation.db.models import OPEN_PREDICATE, AuditLog, RejectedEvent, Remediation
from remediation.domain.admission import Reportable, TimeBounds
from remediation.domain.causes import planned_action
from remediation.domain.context import RemediationContext
from remediation.domain.events import NodeEvent
from remediation.domain.policy import (
    Clock,
    Decision,
    DecisionKind,
)
from remediation.domain.statemachine import NodeStatus, RemediationStatus, Step
from remediation.domain.states import AuditAction
from remediation.incidents.service import record_domains
from remediation.profiles.rules import Governance, Resolution, label_keys
from remediation.profiles.service import base_only, record_facts
from remediation.profiles.settings import Mode
from remediation.services.audit import would
from remediation.services.decisions import Batch
from remediation.services.dedupe import taken_by_others, unique_by_key
from remediation.services.fencing import fence_events
from remediation.services.payloads import admit_events, parse_payloads, reject
from remediation.services.pool import confirm_nodes
from remediation.settings import EffectivePolicy, IncidentSettings, PolicySettings

log = logging.getLogger(__name__)


@dataclass
class IngestResult:
    recorded: int = 0
    duplicates: int = 0
    rejected: int = 0
    opened: list[tuple[int, str]] = field(default_factory=list)  # (remediation id, first step)
    repairs: list[int] = field(default_factory=list)  # the domain repairs the batch opened
    decisions: dict[str, int] = field(default_factory=dict)


def _dialect_insert(session: Session):  # type: ignore[no-untyped-def]
    return postgresql.insert if session.get_bind().dialect.name == "postgresql" else sqlite.insert


@dataclass(frozen=True)
class IngestRules:
    """How a batch is decided beyond its policy; the same for every batch one service reads.
    ``dry_run``: the service runs in dry-run; what it opens is marked so (never counted: honest dry-run).
    ``incidents``: the correlated-incident rule (defaults when not given; see services.incidents).
    ``gpu_reset``: a job can run on a node (``validation.runs_jobs``), so a gpu-reset rung is planned.
    ``governance``: the profiles; each node is decided under its profile's policy, and what opens records
    its profile and that policy. Without it, every node is under the batch's policy and nothing is
    recorded (the workflow then reads today's configuration)."""

    dry_run: bool = False
    incidents: IncidentSettings | None = None
    gpu_reset: bool = False
    governance: Governance | None = None


@dataclass(frozen=True)
class StreamChecks:
    """What a payload read from the stream is checked against before it is recorded.
    ``max_bytes``: a larger payload is rejected (``broker.max_event_bytes``; None: no limit).
    ``bounds``: how far timestamps may be from the ingest's clock (``broker.max_clock_skew_s``,
    ``broker.max_event_age_s``); None takes them as written (a rehearsal's simulated clock).
    ``counters``: each leader lock's fencing-token counter, read from Redis after the batch was (None:
    tokens are checked only against each other, :mod:`remediation.services.fencing`)."""

    max_bytes: int | None = None
    bounds: TimeBounds | None = None
    counters: Mapping[str, int] | None = None


def ingest(
    session: Session, payloads: Sequence[str | bytes], policy: PolicySettings, *, clock: Clock,
    rules: IngestRules = IngestRules(), checks: StreamChecks = StreamChecks(),
) -> IngestResult:
    """Record and decide a batch read from the stream. The caller owns the transaction (commit after,
    then enqueue). Every payload that is not an event the stream may report is kept in
    ``rejected_events`` with the reason, and the rest of the batch goes on."""
    events, rejected = admitted(session, payloads, clock.now(), checks=checks,
                                reportable=reportable(rules.incidents, rules.governance))
    return record(session, events, policy, clock=clock, rules=rules, rejected=rejected)


def admitted(
    session: Session, payloads: Sequence[str | bytes], now: datetime, *, checks: StreamChecks,
    reportable: Reportable,
) -> tuple[list[NodeEvent], list[tuple[str, str]]]:
    """The events of a batch the stream may report, and (payload, why) of every other payload: what
    does not parse, what the stream may not report, what a replaced leader published."""
    parsed, rejected = parse_payloads(payloads, checks.max_bytes)
    events, refused = admit_events(parsed, now, checks.bounds, counters=checks.counters,
                                   reportable=reportable)
    events, fenced = fence_events(session, events, now)  # what a replaced leader published
    return events, rejected + refused + fenced


def reportable(incidents: IncidentSettings | None, governance: Governance | None) -> Reportable:
    """The facts the watchers may report under this configuration (what it was not given: unchecked)."""
    return Reportable(
        label_domains=frozenset(incidents.label_keys) if incidents is not None else None,
        profile_labels=frozenset(label_keys(governance.profiles)) if governance is not None else None,
    )


def record(
    session: Session, events: Sequence[NodeEvent], policy: PolicySettings, *, clock: Clock,
    rules: IngestRules = IngestRules(), rejected: Sequence[tuple[str, str]] = (),
) -> IngestResult:
    """Record and decide events already admitted: the stream's, after :func:`ingest` checked them, or a
    human's report, built by the lever that recorded its actor (never read from the stream).
    ``rejected``: (payload, why) of what the batch refused, kept in ``rejected_events``.
    Its phases: keep the refused, record the new events, decide them round by round, write back."""
    now = clock.now()
    result = IngestResult()
    _keep_rejected(session, rejected, now, result=result)
    if not events:
        return result
    fresh, unique, new_keys = _record_events(session, events, now, result=result)
    if not fresh:
        return result
    governance = rules.governance or Governance(base_only(policy, rules.incidents))
    batch = Batch.load(session, fresh, unique, policy=policy, governance=governance, now=now)
    batch.dry_run = rules.dry_run
    todo = fresh
    while todo:
        # One round decides every event up to (and including) the first one that opens a remediation
        # on its node; the node's later events wait for the next round, when the new remediation has
        # its id. All of a round's remediations are inserted together.
        todo, opens = batch.decide_round(todo, new_keys, now)
        opened = _open(session, opens, new_keys, now=now, gov=batch.gov, rules=rules)
        result.opened += batch.opened_round(session, opens, opened, new_keys=new_keys, now=now,
                                            dry_run=rules.dry_run)
    batch.write_back(session, now)
    result.decisions = dict(batch.counts)
    result.repairs = list(batch.routes.opened)
    return result


def _keep_rejected(session: Session, rejected: Sequence[tuple[str, str]], now: datetime,
                   *, result: IngestResult) -> None:
    if rejected:
        session.execute(
            insert(RejectedEvent),
            [{"received_at": now, "payload": p, "error": e} for p, e in rejected],
        )
        result.rejected = len(rejected)


def _record_events(
    session: Session, events: Sequence[NodeEvent], now: datetime, *, result: IngestResult
) -> tuple[list[NodeEvent], dict[str, NodeEvent], dict[str, int]]:
    """Insert the batch's events (each key once) and their nodes' facts; returns the events new to the
    database, oldest first, every event by key, and the new events' ids by key."""
    # Within one batch the same key may appear twice (edge + resync); keep the first.
    unique, result.duplicates = unique_by_key(events)
    _ensure_nodes(session, {ev.node for ev in unique.values()}, now)
    confirm_nodes(session, unique.values(), now)  # a resync's re-sent inventory confirms too
    new_keys = insert_events(session, [_event_row(ev) for ev in unique.values()], now)
    if rekeyed := taken_by_others(session, [ev for key, ev in unique.items() if key not in new_keys]):
        unique.update((ev.dedupe_key, ev) for ev in rekeyed)  # a key sent ahead hides no real edge
        new_keys.update(insert_events(session, [_event_row(ev) for ev in rekeyed], now))
    result.duplicates += len(unique) - len(rekeyed) - len(new_keys)
    fresh = sorted((ev for key, ev in unique.items() if key in new_keys), key=lambda e: e.observed_at)
    result.recorded = len(fresh)
    if fresh:
        record_domains(session, fresh, now)
        record_facts(session, fresh)
    return fresh, unique, new_keys


def _open(session: Session, opens: dict[str, tuple[NodeEvent, Decision]], event_ids: dict[str, int],
          *, now: datetime, gov: dict[str, tuple[Resolution,
                                                 EffectivePolicy]], rules: IngestRules) -> dict[str, int]:
    """Insert a round's remediations at once. The partial unique index (one open per node) is the
    arbiter against a concurrent ingest: a conflicting row is skipped, not an error. What opens records
    its policy only under profiles (``rules.governance``)."""
    if not opens:
        return {}
    dry_run, gpu_reset, record = rules.dry_run, rules.gpu_reset, rules.governance is not None
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
        index_elements=["cluster", "node"], index_where=OPEN_PREDICATE
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
    ensure_nodes(session, sorted(names), NodeStatus.HEALTHY.value, now=now)


def ingest_batch(
    sessions: sessionmaker[Session], payloads: Sequence[str | bytes], policy: PolicySettings, *, clock: Clock,
    rules: IngestRules = IngestRules(), checks: StreamChecks = StreamChecks(),
) -> IngestResult:
    """Record a batch in one transaction; if the database refuses it for its *content* (a data error,
    not an outage), record the payloads one by one and keep any that still fail in rejected_events.
    One poisonous payload therefore costs one row, never the stream behind it. Outages
    (OperationalError, InterfaceError) propagate: nothing is acknowledged and the batch is retried."""
    try:
        with sessions() as s, s.begin():
            return ingest(s, payloads, policy, clock=clock, rules=rules, checks=checks)
    except (OperationalError, InterfaceError):
        raise
    except SQLAlchemyError:
        pass
    total = IngestResult()
    for payload in payloads:
        try:
            with sessions() as s, s.begin():
                one = ingest(s, [payload], policy, clock=clock, rules=rules, checks=checks)
        except (OperationalError, InterfaceError):
            raise
        except SQLAlchemyError as exc:
            with sessions() as s, s.begin():
                reject(s, payload, f"could not be recorded: {str(getattr(exc, 'orig', exc)).splitlines()[0]}",
                       now=clock.now())
            total.rejected += 1
            continue
        total.recorded += one.recorded
        total.duplicates += one.duplicates
        total.rejected += one.rejected
        total.opened += one.opened
        total.repairs += one.repairs
        for k, v in one.decisions.items():
            total.decisions[k] = total.decisions.get(k, 0) + v
    return total
