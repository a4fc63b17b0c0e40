"""Prometheus metrics read from the database at scrape time.

A handful of aggregate queries per scrape report what the database holds: events, decisions,
remediations (closed and open), steps, nodes, Slurm blocks, incidents, the breaker and pause, workflow lag, rejected
and fenced events, validations and each profile's series. Every series read from the database carries a
``cluster`` label (one database serves several clusters). Counters are counts of append-only rows, so
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
from remediation.db.models import (
    Control,
    DomainRepair,
    Event,
    LeaderFence,
    Node,
    RejectedEvent,
    Remediation,
    RemediationStep,
)
from remediation.db.queries import BREAKER, PAUSED
from remediation.domain.controls import BreakerLatch, PauseState
from remediation.domain.policy import Clock
from remediation.domain.statemachine import (
    OPEN_STATUSES,
    QUARANTINE_STATUSES,
    NodeStatus,
    RemediationStatus,
    Step,
)
from remediation.incidents import service as incidents
from remediation.profiles.metrics import profile_metrics
from remediation.services.nvlink import block_health
from remediation.validation.metrics import validation_metrics
from remediation.vocabulary import DEFAULT_CLUSTER

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
        clusters = known_clusters(s)
        yield from _event_metrics(s, clusters)
        yield from _remediation_metrics(s, clusters)
        yield self._step_histogram(s)
        yield from _node_metrics(s, clusters)
        yield from _block_metrics(s)
        yield from _control_metrics(s, clusters)
        yield from _age_metrics(s, now, clusters)
        yield from validation_metrics(s, clusters)
        yield from profile_metrics(s)

    def _step_histogram(self, s: Session) -> HistogramMetricFamily:
        hist = HistogramMetricFamily("remediation_step_duration_seconds",
                                     "Duration of finished step attempts (started to done/failed)",
                                     labels=["cluster", "step"])
        dur = _seconds_between(s, RemediationStep.started_at, RemediationStep.finished_at)
        cols = [func.sum(case((dur <= b, 1), else_=0)) for b in STEP_BUCKETS]
        # remediation_steps has no cluster of its own: a step is its remediation's.
        q = (select(Remediation.cluster, RemediationStep.step, func.count(), func.coalesce(func.sum(dur), 0.0),
                    *cols)
             .join(Remediation, Remediation.id == RemediationStep.remediation_id)
             .where(RemediationStep.finished_at.is_not(None))
             .group_by(Remediation.cluster, RemediationStep.step))
        for cluster, step, count, total, *cumulative in s.execute(q):
            buckets = [(_le(b), int(c or 0)) for b, c in zip(STEP_BUCKETS, cumulative, strict=True)]
            buckets.append(("+Inf", int(count)))
            hist.add_metric([cluster, step], buckets, float(total))
        return hist


def known_clusters(s: Session) -> list[str]:
    """The clusters the database knows (a node or a remediation names them), ``default`` when none:
    series that report every status or step, 0 when none, do so per cluster."""
    found = set(s.scalars(select(Node.cluster).distinct())) | set(s.scalars(select(Remediation.cluster).distinct()))
    return sorted(found) or [DEFAULT_CLUSTER]


def _event_metrics(s: Session, clusters: list[str]) -> Iterable[Metric]:
    """Events by source and kind and by decision, payloads rejected, and events fenced at ingest."""
    events = CounterMetricFamily("remediation_events", "Events recorded, by source and kind",
                                 labels=["cluster", "source", "kind"])
    for cluster, source, kind, n in s.execute(select(Event.cluster, Event.source, Event.kind, func.count())
                                              .group_by(Event.cluster, Event.source, Event.kind)):
        events.add_metric([cluster, source, kind], n)
    yield events
    decisions = CounterMetricFamily("remediation_event_decisions", "Events by the decision taken",
                                    labels=["cluster", "decision"])
    for cluster, decision, n in s.execute(select(Event.cluster, Event.decision, func.count())
                                          .group_by(Event.cluster, Event.decision)):
        decisions.add_metric([cluster, decision or "pending"], n)
    yield decisions
    rejected = CounterMetricFamily("remediation_rejected_events", "Payloads that could not be ingested",
                                   labels=["cluster"])
    counted = dict(s.execute(select(RejectedEvent.cluster, func.count()).group_by(RejectedEvent.cluster)).all())
    for cluster in sorted({*clusters, *counted}):  # 0 for a cluster that rejected nothing: the alert reads it
        rejected.add_metric([cluster], counted.get(cluster, 0))
    yield rejected
    fenced = CounterMetricFamily("remediation_fenced_events", "Events dropped at ingest: published under a "
                                 "leader lock's fencing token a newer holder had replaced", labels=["cluster", "lock"])
    for cluster, lock, n in s.execute(select(LeaderFence.cluster, LeaderFence.lock, LeaderFence.fenced)):
        fenced.add_metric([cluster, lock], n)
    yield fenced


def _remediation_metrics(s: Session, clusters: list[str]) -> Iterable[Metric]:
    """Remediations closed by outcome, open by status and step, and opened by fault class and action."""
    closed = CounterMetricFamily("remediation_remediations", "Closed remediations by outcome",
                                 labels=["cluster", "outcome"])
    opened = GaugeMetricFamily("remediation_remediations_open", "Open remediations by status and step",
                               labels=["cluster", "status", "step"])
    counts = {(c, st.value): 0 for c in clusters for st in RemediationStatus if st not in OPEN_STATUSES}
    for cluster, status, step, n in s.execute(
            select(Remediation.cluster, Remediation.status, Remediation.step, func.count())
            .group_by(Remediation.cluster, Remediation.status, Remediation.step)):
        if status in OPEN_STATUSES:
            opened.add_metric([cluster, status, step], n)
        else:
            counts[cluster, status] = counts.get((cluster, status), 0) + n
    for (cluster, outcome), n in counts.items():
        closed.add_metric([cluster, outcome], n)
    yield closed
    yield opened
    by_class = CounterMetricFamily(
        "remediation_remediations_by_class", "Remediations opened (dry-run excluded) by the fault class "
        "read from the signal and the action its ladder chose (now, or last)",
        labels=["cluster", "fault_class", "action"])
    r = Remediation
    for cluster, cls, action, n in s.execute(select(r.cluster, r.fault_class, r.action, func.count())
                                             .where(r.dry_run.is_(False))
                                             .group_by(r.cluster, r.fault_class, r.action)):
        by_class.add_metric([cluster, cls or "unset", action or "unset"], n)
    yield by_class


def _node_metrics(s: Session, clusters: list[str]) -> Iterable[Metric]:
    """Nodes by status (every status a series, 0 when none) and those in quarantine."""
    nodes = GaugeMetricFamily("remediation_nodes", "Nodes by status", labels=["cluster", "status"])
    by_status = {(c, st.value): 0 for c in clusters for st in NodeStatus}
    for cluster, nstatus, n in s.execute(select(Node.cluster, Node.status, func.count())
                                         .group_by(Node.cluster, Node.status)):
        by_status[cluster, nstatus] = n
    for (cluster, label), n in by_status.items():
        nodes.add_metric([cluster, label], n)
    yield nodes
    quarantined = GaugeMetricFamily("remediation_quarantined_nodes", "Nodes in quarantine", labels=["cluster"])
    for c in clusters:
        quarantined.add_metric([c], sum(by_status.get((c, st.value), 0) for st in QUARANTINE_STATUSES))
    yield quarantined


def _block_metrics(s: Session) -> Iterable[Metric]:
    """Each topology/block block Slurm gave a size: its healthy nodes, its smallest block, and whether
    it is a partial domain (fewer healthy nodes than the smallest block); and the domain repairs."""
    labels = ["cluster", "block"]
    healthy = GaugeMetricFamily("remediation_block_healthy_nodes", "Healthy nodes of each Slurm block", labels=labels)
    size = GaugeMetricFamily("remediation_block_min_size", "Each Slurm block's smallest block size (BlockSizes)",
                             labels=labels)
    partial = GaugeMetricFamily("remediation_block_partial", "1 while a Slurm block's healthy nodes are fewer than "
                                "its smallest block size: no job of that size fits there", labels=labels)
    for one in block_health(s):
        healthy.add_metric([one.cluster, one.name], one.healthy)
        size.add_metric([one.cluster, one.name], one.size)
        partial.add_metric([one.cluster, one.name], int(one.partial))
    yield from (healthy, size, partial)
    repairs = CounterMetricFamily("remediation_domain_repairs", "Repairs of whole NVLink domains, by how they "
                                  "stand or ended (running, returned, quarantined, cancelled; dry-run excluded)",
                                  labels=["cluster", "status"])
    for cluster, status, n in s.execute(select(DomainRepair.cluster, DomainRepair.status, func.count()).where(
            DomainRepair.dry_run.is_(False)).group_by(DomainRepair.cluster, DomainRepair.status)):
        repairs.add_metric([cluster, status.value], n)
    yield repairs


def _control_metrics(s: Session, clusters: list[str]) -> Iterable[Metric]:
    """The storm breaker (and why it is open), incidents open and ever opened, and the pause, per cluster."""
    rows = s.execute(select(Control.cluster, Control.key, Control.value).where(Control.key.in_([BREAKER, PAUSED])))
    stored = {(cluster, key): dict(value or {}) for cluster, key, value in rows}
    clusters = sorted(set(clusters) | {c for c, _ in stored})
    is_open = GaugeMetricFamily("remediation_breaker_open", "1 while the storm breaker holds machine actions "
                                "(it latches: open until a human closes it)", labels=["cluster"])
    why = GaugeMetricFamily("remediation_breaker_open_info", "Why the storm breaker is open (1 while open)",
                            labels=["cluster", "reason", "since"])
    paused = GaugeMetricFamily("remediation_paused", "1 while all automation is paused (by a human, or by the "
                               "system on a fault in its own plumbing)", labels=["cluster"])
    for c in clusters:
        latch = BreakerLatch.load(stored.get((c, BREAKER), {}))
        is_open.add_metric([c], 1 if latch.open else 0)
        if latch.open:
            why.add_metric([c, (latch.reason or "")[:200], latch.at or ""], 1)
        paused.add_metric([c], 1 if PauseState.load(stored.get((c, PAUSED), {})).paused else 0)
    yield is_open
    yield why
    seen = incidents.counts_by_cluster(s)
    now_open = GaugeMetricFamily("remediation_incidents_open", "Topology-correlated incidents open now "
                                 "(one failure domain, many nodes; dry-run ones excluded)", labels=["cluster"])
    ever = CounterMetricFamily("remediation_incidents", "Topology-correlated incidents ever opened "
                               "(dry-run ones excluded)", labels=["cluster"])
    for c in sorted(set(clusters) | set(seen)):
        counted = seen.get(c, {"open": 0, "total": 0})
        now_open.add_metric([c], counted["open"])
        ever.add_metric([c], counted["total"])
    yield now_open
    yield ever
    yield paused


def _age_metrics(s: Session, now: datetime, clusters: list[str]) -> Iterable[Metric]:
    """How overdue the most overdue open step is, and the oldest open remediation's age by step."""
    lag = GaugeMetricFamily("remediation_workflow_lag_seconds",
                            "How overdue the most overdue open remediation step is", labels=["cluster"])
    overdue = dict(s.execute(select(Remediation.cluster, func.min(Remediation.next_run_at)).where(
        Remediation.status.in_(OPEN_STATUSES), Remediation.next_run_at < now).group_by(Remediation.cluster)).all())
    for c in clusters:
        oldest = overdue.get(c)
        lag.add_metric([c], max(0.0, (now - aware(oldest)).total_seconds()) if oldest is not None else 0.0)
    yield lag
    age = GaugeMetricFamily("remediation_oldest_open_seconds", "Age of the oldest open remediation, by the "
                            "step it stands at (one past every step timeout is stuck)", labels=["cluster", "step"])
    # 0: none open there (a series, not a gap)
    ages = {(c, st.value): 0.0 for c in clusters for st in Step if st is not Step.DONE}
    for cluster, step, first in s.execute(
            select(Remediation.cluster, Remediation.step, func.min(Remediation.opened_at))
            .where(Remediation.status.in_(OPEN_STATUSES)).group_by(Remediation.cluster, Remediation.step)):
        ages[cluster, step] = max(0.0, (now - aware(first)).total_seconds())
    for (cluster, label), seconds in ages.items():
        age.add_metric([cluster, label], seconds)
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
