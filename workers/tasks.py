"""Thin Celery tasks: each takes plain ids, calls the domain, and enqueues follow-ups after the commit.

One base class owns late acks and the runtime; step tasks turn ``RetryLater`` into Celery's retry
(honouring Retry-After). Tasks never commit. Every workflow step is its own task,
``remediation.step.<name>``.

Why: docs/running.md#the-workers
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from celery import Task
from sqlalchemy.exc import OperationalError

from remediation.adapters import memstream
from remediation.adapters.celery import (
    INGEST_TASK,
    ISOLATE_TASK,
    PRUNE_TASK,
    RELEASE_TASK,
    RESUME_TASK,
    SWEEP_TASK,
    celery_dispatcher,
    step_task,
)
from remediation.adapters.lock import drawn_tokens
from remediation.adapters.stream import Reading, consume
from remediation.clock import SystemClock
from remediation.domain.ownership import release_node
from remediation.domain.statemachine import Step
from remediation.domain.states import AuditAction
from remediation.ports.dispatch import FollowUp
from remediation.ports.errors import TransientError
from remediation.services.audit import audit
from remediation.services.ingest import IngestRules, StreamChecks, ingest_batch
from remediation.services.lever_rules import committed_release, open_steps
from remediation.services.payloads import time_bounds
from remediation.services.retention import prune_events
from remediation.services.workflow import RetryLater
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


def enqueue(followups: Sequence[FollowUp | None]) -> None:
    """Queue follow-up steps on this worker's own app (the same broker the clients send to)."""
    celery_dispatcher(settings, app).steps(followups)


@app.task(name=INGEST_TASK, base=DomainTask, bind=True,
          autoretry_for=(OperationalError, ConnectionError), retry_backoff=True, retry_backoff_max=60,
          max_retries=None)
def ingest(self: DomainTask) -> int:
    rt = self.rt
    opened: list[FollowUp] = []

    def handle(payloads: Sequence[bytes]) -> None:
        # The locks' counters, read after the batch: a token above its lock's counter was never drawn.
        counters = None if rt.embedded else drawn_tokens(rt.redis, rt.settings.broker.key_prefix)
        rules = IngestRules(dry_run=rt.settings.dry_run, incidents=rt.settings.incidents,
                            gpu_reset=rt.settings.validation.runs_jobs, governance=rt.governance)
        checks = StreamChecks(max_bytes=rt.settings.broker.max_event_bytes, bounds=time_bounds(rt.settings.broker),
                              counters=counters)
        result = ingest_batch(rt.sessions, payloads, rt.settings.policy, clock=SystemClock(), rules=rules,
                              checks=checks)
        opened.extend(FollowUp(rid, step) for rid, step in result.opened)

    if rt.embedded:
        n = memstream.consume(handle, rt.settings.broker.ingest_batch)
    else:
        reading = Reading(batch=rt.settings.broker.ingest_batch,
                          claim_idle_ms=rt.settings.broker.ingest_claim_idle_s * 1000,
                          keep=rt.settings.broker.stream_max_len)
        n = consume(rt.redis, rt.keys, handle, reading=reading)
    enqueue(opened)
    return n


@app.task(name=RELEASE_TASK, base=DomainTask, bind=True,
          autoretry_for=(TransientError,), retry_backoff=True, retry_backoff_max=300, max_retries=10)
def release(self: DomainTask, audit_id: int) -> str:
    """Undo our quarantine in Slurm and Kubernetes after a human released the node: the release in
    audit row ``audit_id``, re-read from Postgres; nothing happens for any other row."""
    rt = self.rt
    with rt.sessions() as s:
        node = committed_release(s, int(audit_id))
    if node is None:
        log.warning("release request for audit row %s refused: not a human release that still stands", audit_id)
        return "refused"
    outcome = release_node(rt.workflow.adapters, node, rt.settings.policy.our_reason_prefix)
    with rt.sessions() as s, s.begin():
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
def sweep(self: DomainTask) -> int:
    self.rt.workflow.probe()  # a self-healing system pause is lifted after enough answers in a row
    followups = self.rt.workflow.sweep()
    enqueue(followups)
    return len(followups)


@app.task(name=PRUNE_TASK, base=DomainTask, bind=True)
def prune(self: DomainTask) -> int:
    """Retention (beat, every retention.prune_interval_s): old events no remediation owns; never audit rows."""
    cfg = self.rt.settings.retention
    return prune_events(self.rt.sessions, cfg.events_older_than, SystemClock().now(),
                        batch=cfg.batch).events_pruned


@app.task(name=ISOLATE_TASK, base=DomainTask, bind=True)
def isolate_batch(self: DomainTask, remediation_ids: list[int]) -> int:
    """Newly opened remediations, many at once through slurm_drain and k8s_cordon (workers/isolate.py)."""
    followups = isolate(self.rt.workflow, remediation_ids, self.rt.settings.workflow.isolate_threads)
    enqueue(followups)
    return len(remediation_ids)


def _run_step(task: DomainTask, step: str, remediation_id: int) -> None:
    try:
        followup = task.rt.workflow.run(remediation_id, step)
    except RetryLater as exc:
        # The engine decided on its own persisted counter that this error is worth another try; Celery
        # only delivers it after the countdown (its own retry count decides nothing).
        raise task.retry(countdown=exc.countdown, max_retries=None) from exc
    enqueue([followup])


def _register(step: Step) -> None:
    @app.task(name=step_task(step), base=DomainTask, bind=True,
              autoretry_for=(OperationalError,), retry_backoff=True, retry_backoff_max=60, max_retries=None)
    def run_step(self: DomainTask, remediation_id: int) -> None:
        _run_step(self, step.value, remediation_id)


for _step in Step:
    if _step is not Step.DONE:
        _register(_step)
