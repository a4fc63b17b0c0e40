"""Thin Celery tasks: each takes plain ids, calls the domain, and enqueues follow-ups after the commit.

One base class owns late acks and the runtime; step tasks turn ``RetryLater`` into Celery's retry
(honouring Retry-After). Tasks never commit. Every workflow step is its own task,
``remediation.step.<name>``.

Why: docs/running.md#the-workers
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime

from celery import Task
from sqlalchemy import select
from sqlalchemy.exc import OperationalError

from remediation.adapters import memstream
from remediation.adapters.bus import Keys
from remediation.adapters.celery import (
    DOMAIN_REPAIR_TASK,
    INGEST_TASK,
    ISOLATE_TASK,
    PRUNE_TASK,
    RELEASE_TASK,
    RESUME_TASK,
    SWEEP_TASK,
    celery_dispatcher,
    due_kwargs,
    step_task,
)
from remediation.adapters.factory import evidence_storage
from remediation.adapters.lock import drawn_tokens
from remediation.adapters.stream import Reading, consume
from remediation.clock import SystemClock
from remediation.db.models import AuditLog
from remediation.db.scope import scoped
from remediation.domain.admission import Published
from remediation.domain.ownership import release_node
from remediation.domain.statemachine import Step
from remediation.domain.states import AuditAction
from remediation.domain_repair.service import PartialDomains
from remediation.evidence_collection.service import EvidenceRetention
from remediation.ports.dispatch import FollowUp
from remediation.ports.errors import TransientError
from remediation.services.audit import audit
from remediation.services.ingest import IngestRules, StreamChecks, ingest_batch
from remediation.services.lever_rules import committed_release, open_steps
from remediation.services.payloads import reject, time_bounds
from remediation.services.retention import prune_events
from remediation.services.workflow import RetryLater
from remediation.vocabulary import DEFAULT_CLUSTER
from remediation.workers.celery_app import app, settings
from remediation.workers.context import Runtime, runtime
from remediation.workers.isolate import isolate

log = logging.getLogger(__name__)


class DomainTask(Task):  # type: ignore[misc]
    abstract = True
    acks_late = True
    reject_on_worker_lost = True

    @property
    def rt(self) -> Runtime:
        return runtime(settings)


def enqueue(followups: Sequence[FollowUp | None], cluster: str | None = None, repairs: Sequence[int] = ()) -> None:
    """Queue follow-up steps on this worker's own app (the same broker the clients send to); isolation
    on ``cluster``'s own queue when named. ``repairs``: domain repairs to look at now."""
    dispatcher = celery_dispatcher(settings, app)
    dispatcher.steps(followups, cluster)
    if repairs:
        dispatcher.repairs(repairs)


@app.task(name=INGEST_TASK, base=DomainTask, bind=True,
          autoretry_for=(OperationalError, ConnectionError), retry_backoff=True, retry_backoff_max=60,
          max_retries=None)
def ingest(self: DomainTask, cluster: str | None = None) -> int:
    """Record what waits on ``cluster``'s event streams, or on every served cluster's when none is named.
    Each cluster has its own ingest (the kick relay and beat send one per cluster), so one cluster's
    storm never holds up another's lone fault."""
    rt = self.rt
    if cluster is not None and cluster not in rt.clusters:
        log.warning("ingest for cluster %s refused: not served by these workers (settings: clusters)", cluster)
        return 0

    def handle(payloads: Sequence[bytes]) -> None:
        # Each cluster's part of a batch is committed, then its follow-ups queued at once, on its own
        # isolate queue: a fault read early in a long backlog starts isolation now. The smallest part
        # goes first: a lone fault in one cluster never waits for another cluster's storm to be opened.
        for cluster, mine in sorted(by_cluster(payloads).items(), key=lambda part: len(part[1])):
            followups, repairs = ingest_cluster(rt, cluster, mine)
            enqueue(followups, cluster, repairs)

    if rt.embedded:
        n = memstream.consume(handle, rt.settings.broker.ingest_batch)
    else:
        reading = Reading(batch=rt.settings.broker.ingest_batch,
                          claim_idle_ms=rt.settings.broker.ingest_claim_idle_s * 1000,
                          keep=rt.settings.broker.stream_max_len)
        keys = rt.keys if cluster is None else Keys(rt.keys.prefix, cluster=cluster)
        n = consume(rt.redis, keys, handle, reading=reading)
    return n


def by_cluster(payloads: Sequence[bytes]) -> dict[str, list[bytes]]:
    """A batch split by the cluster whose stream each payload was read from, in the batch's order."""
    out: dict[str, list[bytes]] = {}
    for payload in payloads:
        out.setdefault(payload.cluster if isinstance(payload, Published) else DEFAULT_CLUSTER, []).append(payload)
    return out


def ingest_cluster(rt: Runtime, cluster: str, payloads: Sequence[bytes]) -> tuple[list[FollowUp], list[int]]:
    """Record one cluster's part of a batch, under its settings, through a session scoped to it; a
    cluster these workers do not serve has its payloads kept in ``rejected_events``, with the reason."""
    sessions = scoped(rt.sessions, cluster)
    cfg = rt.clusters.get(cluster)
    if cfg is None:
        now = SystemClock().now()
        with sessions() as s, s.begin():
            for payload in payloads:
                reject(s, payload, f"cluster {cluster} is not served by these workers (settings: clusters)", now=now)
        return [], []
    # The locks' counters, read after the batch: a token above its lock's counter was never drawn.
    counters = None if rt.embedded else drawn_tokens(rt.redis, Keys(rt.keys.prefix, cluster=cluster).space)
    rules = IngestRules(dry_run=cfg.dry_run, incidents=cfg.incidents, gpu_reset=cfg.validation.runs_jobs,
                        governance=rt.governances[cluster])
    checks = StreamChecks(max_bytes=cfg.broker.max_event_bytes, bounds=time_bounds(cfg.broker), counters=counters)
    result = ingest_batch(sessions, payloads, cfg.policy, clock=SystemClock(), rules=rules, checks=checks)
    return [FollowUp(rid, step) for rid, step in result.opened], result.repairs


@app.task(name=RELEASE_TASK, base=DomainTask, bind=True,
          autoretry_for=(TransientError,), retry_backoff=True, retry_backoff_max=300, max_retries=10)
def release(self: DomainTask, audit_id: int) -> str:
    """Undo our quarantine in Slurm and Kubernetes after a human released the node: the release in
    audit row ``audit_id``, re-read from Postgres; nothing happens for any other row."""
    rt = self.rt
    with rt.sessions() as s:
        cluster = s.scalar(select(AuditLog.cluster).where(AuditLog.id == int(audit_id)))
    workflow = rt.workflows.get(cluster) if cluster is not None else None
    node = None
    if workflow is not None:
        with workflow.sessions() as s:
            node = committed_release(s, int(audit_id))
    if workflow is None or node is None:
        log.warning("release request for audit row %s refused: not a human release that still stands", audit_id)
        return "refused"
    outcome = release_node(workflow.adapters, node, workflow.settings.policy.our_reason_prefix)
    with workflow.sessions() as s, s.begin():
        audit(s, SystemClock().now(), rt.settings.actor, action=AuditAction.RELEASE_DONE, target=node,
              reason=outcome, detail={"release": int(audit_id)})
    return outcome


@app.task(name=RESUME_TASK, base=DomainTask, bind=True)
def resume(self: DomainTask, remediation_ids: list[int]) -> int:
    """A lever's follow-ups: run the step the database has for each open remediation named."""
    with self.rt.sessions() as s:
        followups = open_steps(s, [int(i) for i in remediation_ids])
    enqueue(followups)
    return len(followups)


@app.task(name=SWEEP_TASK, base=DomainTask, bind=True)
def sweep(self: DomainTask, cluster: str | None = None) -> int:
    """One cluster's sweep (beat sends one per cluster, so a cluster whose slurmctld is slow to answer
    delays no other's), or every cluster's when none is named."""
    swept = 0
    for name, workflow in self.rt.workflows.items():  # each cluster's pause, breaker and work are its own
        if cluster is not None and name != cluster:
            continue
        workflow.probe()  # a self-healing system pause is lifted after enough answers in a row
        followups = workflow.sweep()
        self.rt.repairs[name].take_down()  # what a cancelled repair had started
        repairs = self.rt.repairs[name].due()
        PartialDomains(self.rt.repairs[name], workflow.governance).sweep()
        enqueue(followups, name, repairs)
        swept += len(followups) + len(repairs)
    return swept


@app.task(name=PRUNE_TASK, base=DomainTask, bind=True)
def prune(self: DomainTask) -> int:
    """Retention (beat, every retention.prune_interval_s): old events no remediation owns, and collected
    evidence past retention.evidence_older_than; never audit rows."""
    cfg = self.rt.settings.retention
    collected = EvidenceRetention(cfg.evidence_older_than, evidence_storage(self.rt.settings))
    return prune_events(self.rt.sessions, cfg.events_older_than, SystemClock().now(),
                        batch=cfg.batch, evidence=collected).events_pruned


@app.task(name=ISOLATE_TASK, base=DomainTask, bind=True)
def isolate_batch(self: DomainTask, remediation_ids: list[int]) -> int:
    """Newly opened remediations, many at once through slurm_drain and k8s_cordon (workers/isolate.py)."""
    followups: list[FollowUp | None] = []
    mine: dict[str, list[int]] = {}
    for rid in remediation_ids:
        mine.setdefault(self.rt.cluster_for(int(rid)) or "", []).append(int(rid))
    for cluster, workflow in self.rt.workflows.items():  # a cluster not served (or no such row): nothing
        if ids := mine.get(cluster):
            followups += isolate(workflow, ids, workflow.settings.workflow.isolate_threads)
    enqueue(followups)
    return len(remediation_ids)


@app.task(name=DOMAIN_REPAIR_TASK, base=DomainTask, bind=True,
          autoretry_for=(OperationalError,), retry_backoff=True, retry_backoff_max=60, max_retries=None)
def domain_repair(self: DomainTask, repair_id: int) -> None:
    """One look at a domain repair; the next is queued after the wait it asks for (none once it closed)."""
    repairs = self.rt.repairs_for(int(repair_id))
    if repairs is None:
        log.warning("domain repair %s: not in a cluster these workers serve; dropped", repair_id)
        return
    wait = repairs.advance(int(repair_id))
    if wait is not None:
        celery_dispatcher(settings, app).repairs([int(repair_id)], countdown=wait)


def _run_step(task: DomainTask, step: str, remediation_id: int, *, due: str | None = None) -> None:
    workflow = task.rt.workflow_for(int(remediation_id))
    if workflow is None:
        log.warning("remediation %s: no such remediation in a cluster these workers serve; step %s dropped",
                    remediation_id, step)
        return
    try:
        followup = workflow.run(remediation_id, step, due=datetime.fromisoformat(due) if due else None)
    except RetryLater as exc:
        # The engine decided on its own persisted counter that this error is worth another try; Celery
        # only delivers it after the countdown (its own retry count decides nothing), as the delivery
        # the engine scheduled for then.
        raise task.retry(countdown=exc.countdown, max_retries=None, kwargs=due_kwargs(exc.due)) from exc
    enqueue([followup])


def _register(step: Step) -> None:
    @app.task(name=step_task(step), base=DomainTask, bind=True,
              autoretry_for=(OperationalError,), retry_backoff=True, retry_backoff_max=60, max_retries=None)
    def run_step(self: DomainTask, remediation_id: int, due: str | None = None) -> None:
        _run_step(self, step.value, remediation_id, due=due)


for _step in Step:
    if _step is not Step.DONE:
        _register(_step)
