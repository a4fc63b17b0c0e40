"""Prometheus metrics read from the database at scrape time.

A handful of aggregate queries per scrape report what the database holds: events, decisions,
remediations (closed and open), steps, nodes, incidents, the breaker and pause, workflow lag, rejected
and fenced events, validations and each profile's series. Counters are counts of append-only rows, so
they only go up; no series has a per-node label.

Why: docs/architecture.md#metrics-are-read-from-the-database
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import case, func, select
from sqlalchemy.orm import Session, sessionmaker

from remediation.clock import SystemClock, aware
from remediation.db.models import Event, LeaderFence, Node, RejectedEvent, Remediation, RemediationStep
from remediation.db.queries import BREAKER, PAUSED, control_get
from remediation.domain.controls import BreakerLatch, PauseState
from remediation.domain.policy import Clock
from remediation.domain.statemachine import OPEN_STATUSES, NodeStatus, RemediationStatus, Step
from remediation.incidents import service as incidents
from remediation.profiles.metrics import profile_metrics
from remediation.validation.metrics import validation_metrics

log = logging.getLogger(__name__)

# Steps range from sub-second (cordon) to tens of minutes (a drain waiting on jobs, a reimage).
STEP_BUCKETS = (1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0)
QueueDepth = Callable[[], dict[str, int]]


class DatabaseCollector(Collector):
    def __init__(self, sessions: sessionmaker[Session], queue_depth: QueueDepth | None = None,
                 clock: Clock | None = None) -> None:
        self.sessions = sessions
        self.queue_depth = queue_depth
        self.clock = clock or SystemClock()

    def collect(self) -> Iterable[Metric]:
        up = GaugeMetricFamily("remediation_database_up", "1 if the last scrape could read the database")
        try:
            with self.sessions() as s:
                metrics = list(self._from_db(s, self.clock.now()))
        except Exception as exc:  # a scrape must answer even when the database is down
            log.warning("metrics: cannot read the database: %s", type(exc).__name__)
            metrics = []
            up.add_metric([], 0)
        else:
            up.add_metric([], 1)
        yield up
        yield from metrics
        if self.queue_depth is not None:
            depth = GaugeMetricFamily("remediation_queue_depth", "Tasks waiting in each broker queue",
                                      labels=["queue"])
            try:
                for queue, n in sorted(self.queue_depth().items()):
                    depth.add_metric([queue], n)
            except Exception as exc:
                log.warning("metrics: cannot read the queue depth: %s", type(exc).__name__)
            yield depth

    def _from_db(self, s: Session, now: datetime) -> Iterable[Metric]:
        """Every series read from the database, in the order the module docstring lists them."""
        yield from _event_metrics(s)
        yield from _remediation_metrics(s)
        yield self._step_histogram(s)
        yield from _node_metrics(s)
        yield from _control_metrics(s)
        yield from _age_metrics(s, now)
        yield from validation_metrics(s)
        yield from profile_metrics(s)

    def _step_histogram(self, s: Session) -> HistogramMetricFamily:
        hist = HistogramMetricFamily("remediation_step_duration_seconds",
                                     "Duration of finished step attempts (started to done/failed)",
                                     labels=["step"])
        dur = _seconds_between(s, RemediationStep.started_at, RemediationStep.finished_at)
        cols = [func.sum(case((dur <= b, 1), else_=0)) for b in STEP_BUCKETS]
        q = (select(RemediationStep.step, func.count(), func.coalesce(func.sum(dur), 0.0), *cols)
             .where(RemediationStep.finished_at.is_not(None)).group_by(RemediationStep.step))
        for step, count, total, *cumulative in s.execute(q):
            buckets = [(_le(b), int(c or 0)) for b, c in zip(STEP_BUCKETS, cumulative, strict=True)]
            buckets.append(("+Inf", int(count)))
            hist.add_metric([step], buckets, float(total))
        return hist


def _event_metrics(s: Session) -> Iterable[Metric]:
    """Events by source and kind and by decision, payloads rejected, and events fenced at ingest."""
    events = CounterMetricFamily("remediation_events", "Events recorded, by source and kind",
                                 labels=["source", "kind"])
    for source, kind, n in s.execute(select(Event.source, Event.kind, func.count())
                                     .group_by(Event.source, Event.kind)):
        events.add_metric([source, kind], n)
    yield events
    decisions = CounterMetricFamily("remediation_event_decisions", "Events by the decision taken",
                                    labels=["decision"])
    for decision, n in s.execute(select(Event.decision, func.count()).group_by(Event.decision)):
        decisions.add_metric([decision or "pending"], n)
    yield decisions
    rejected = CounterMetricFamily("remediation_rejected_events", "Payloads that could not be ingested")
    rejected.add_metric([], s.scalar(select(func.count()).select_from(RejectedEvent)) or 0)
    yield rejected
    fenced = CounterMetricFamily("remediation_fenced_events", "Events dropped at ingest: published under a "
                                 "leader lock's fencing token a newer holder had replaced", labels=["lock"])
    for lock, n in s.execute(select(LeaderFence.lock, LeaderFence.fenced)):
        fenced.add_metric([lock], n)
    yield fenced


def _remediation_metrics(s: Session) -> Iterable[Metric]:
    """Remediations closed by outcome, open by status and step, and opened by fault class and action."""
    closed = CounterMetricFamily("remediation_remediations", "Closed remediations by outcome",
                                 labels=["outcome"])
    opened = GaugeMetricFamily("remediation_remediations_open", "Open remediations by status and step",
                               labels=["status", "step"])
    counts = {st.value: 0 for st in RemediationStatus if st not in OPEN_STATUSES}
    for status, step, n in s.execute(select(Remediation.status, Remediation.step, func.count())
                                     .group_by(Remediation.status, Remediation.step)):
        if status in OPEN_STATUSES:
            opened.add_metric([status, step], n)
        else:
            counts[status] = counts.get(status, 0) + n
    for outcome, n in counts.items():
        closed.add_metric([outcome], n)
    yield closed
    yield opened
    by_class = CounterMetricFamily(
        "remediation_remediations_by_class", "Remediations opened (dry-run excluded) by the fault class "
        "read from the signal and the action its ladder chose (now, or last)", labels=["fault_class", "action"])
    for cls, action, n in s.execute(select(Remediation.fault_class, Remediation.action, func.count())
                                    .where(Remediation.dry_run.is_(False))
                                    .group_by(Remediation.fault_class, Remediation.action)):
        by_class.add_metric([cls or "unset", action or "unset"], n)
    yield by_class


def _node_metrics(s: Session) -> Iterable[Metric]:
    """Nodes by status (every status a series, 0 when none) and those in quarantine."""
    nodes = GaugeMetricFamily("remediation_nodes", "Nodes by status", labels=["status"])
    by_status = {st.value: 0 for st in NodeStatus}
    for nstatus, n in s.execute(select(Node.status, func.count()).group_by(Node.status)):
        by_status[nstatus] = n
    for label, n in by_status.items():
        nodes.add_metric([label], n)
    yield nodes
    yield GaugeMetricFamily("remediation_quarantined_nodes", "Nodes in quarantine",
                            value=by_status[NodeStatus.QUARANTINED.value])


def _control_metrics(s: Session) -> Iterable[Metric]:
    """The storm breaker (and why it is open), incidents open and ever opened, and the pause."""
    latch = BreakerLatch.load(control_get(s, BREAKER))
    yield GaugeMetricFamily("remediation_breaker_open", "1 while the storm breaker holds machine actions "
                            "(it latches: open until a human closes it)", value=1 if latch.open else 0)
    why = GaugeMetricFamily("remediation_breaker_open_info", "Why the storm breaker is open (1 while open)",
                            labels=["reason", "since"])
    if latch.open:
        why.add_metric([(latch.reason or "")[:200], latch.at or ""], 1)
    yield why
    seen = incidents.counts(s)
    yield GaugeMetricFamily("remediation_incidents_open", "Topology-correlated incidents open now "
                            "(one failure domain, many nodes; dry-run ones excluded)", value=seen["open"])
    yield CounterMetricFamily("remediation_incidents", "Topology-correlated incidents ever opened "
                              "(dry-run ones excluded)", value=seen["total"])
    yield GaugeMetricFamily("remediation_paused", "1 while all automation is paused (by a human, or by the system on a fault in its own plumbing)",
                            value=1 if PauseState.load(control_get(s, PAUSED)).paused else 0)


def _age_metrics(s: Session, now: datetime) -> Iterable[Metric]:
    """How overdue the most overdue open step is, and the oldest open remediation's age by step."""
    oldest = s.scalar(select(func.min(Remediation.next_run_at)).where(
        Remediation.status.in_(OPEN_STATUSES), Remediation.next_run_at < now))
    lag = max(0.0, (now - aware(oldest)).total_seconds()) if oldest is not None else 0.0
    yield GaugeMetricFamily("remediation_workflow_lag_seconds",
                            "How overdue the most overdue open remediation step is", value=lag)
    age = GaugeMetricFamily("remediation_oldest_open_seconds", "Age of the oldest open remediation, by the "
                            "step it stands at (one past every step timeout is stuck)", labels=["step"])
    ages = {st.value: 0.0 for st in Step if st is not Step.DONE}  # 0: none open there (a series, not a gap)
    for step, first in s.execute(select(Remediation.step, func.min(Remediation.opened_at))
                                 .where(Remediation.status.in_(OPEN_STATUSES)).group_by(Remediation.step)):
        ages[step] = max(0.0, (now - aware(first)).total_seconds())
    for label, seconds in ages.items():
        age.add_metric([label], seconds)
    yield age


def _seconds_between(s: Session, start: Any, end: Any) -> Any:
    if s.get_bind().dialect.name == "postgresql":
        return func.extract("epoch", end - start)
    # julianday() is a float of days since 4714 BC: at today's magnitude a difference carries tens of
    # microseconds of rounding noise, enough to push a 30 s step past the le="30" bucket. Round to the
    # millisecond, which is below any step's real resolution.
    return func.round((func.julianday(end) - func.julianday(start)) * 86400.0, 3)


def _le(bound: float) -> str:
    return f"{bound:g}" if bound != int(bound) else f"{bound:.1f}"


def make_registry(sessions: sessionmaker[Session], queue_depth: QueueDepth | None = None,
                  clock: Clock | None = None) -> CollectorRegistry:
    """A registry of its own per app, so tests and several apps in one process never collide."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(DatabaseCollector(sessions, queue_depth, clock))
    return registry
