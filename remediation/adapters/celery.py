"""The broker as a client sees it: one Celery app that only *sends* tasks, by name.

Watchers, the CLI and the API send tasks by name (``remediation.ingest``, ``remediation.step.<step>``,
``remediation.release``, ...) without importing the workers; task names are listed here once.
:mod:`remediation.workers.celery_app` builds on :func:`make_app`, so both sides share broker settings, queues and
routes. The API, the CLI and beat write only the ``requests`` queue.

Why: docs/architecture.md#events-travel-on-a-redis-stream-not-one-celery-message-each
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from celery import Celery
from kombu.transport.redis import PRIORITY_STEPS, Channel

from remediation.domain.statemachine import HAPPY_PATH
from remediation.ports.dispatch import FollowUp
from remediation.settings import Settings

# Re-exported (``as``): the queues the tasks route to and a worker consumes, named in the vocabulary
# so that `remediation worker` can name them without importing Celery.
from remediation.vocabulary import INGEST_QUEUE as INGEST_QUEUE
from remediation.vocabulary import REQUEST_QUEUE as REQUEST_QUEUE
from remediation.vocabulary import WORKER_QUEUES as WORKER_QUEUES
from remediation.vocabulary import WORKFLOW_QUEUE as WORKFLOW_QUEUE

FIRST = HAPPY_PATH[0].value  # a remediation's first step: slurm_drain
INGEST_TASK = "remediation.ingest"
RELEASE_TASK = "remediation.release"
SWEEP_TASK = "remediation.sweep"
NOTIFY_TASK = "remediation.notify"
PRUNE_TASK = "remediation.prune"
ISOLATE_TASK = "remediation.isolate"
RESUME_TASK = "remediation.resume"
DOMAIN_REPAIR_TASK = "remediation.domain_repair"  # one look at a domain repair (remediation.domain_repair)
REPAIR_REQUESTS_TASK = "remediation.repair_requests"  # deliver the repair requests due (remediation.repair_requests)


#: Message priorities on the Redis transport: lower goes first, across every queue a worker reads
#: (kombu pops each priority's lists before the next's). A message without one is at 0.
ISOLATION = 0  # isolate tasks: taking a node out of the schedulers' hands comes first
LATER_STEP = 6  # every other step: a storm's follow-up steps wait behind every cluster's isolation


def queue_lists(queue: str) -> list[str]:
    """The Redis lists (under the broker's key prefix) that hold ``queue``'s messages: kombu's Redis
    transport keeps one per priority step, the first under the queue's own name."""
    return [queue if step == 0 else f"{queue}{Channel.sep}{step}" for step in PRIORITY_STEPS]


def isolate_queue(cluster: str) -> str:
    """The queue of one cluster's isolate tasks. A worker reads each served cluster's in turn (kombu's
    round robin over queues), so one cluster's storm never stands in line before another's fault."""
    return f"isolate.{cluster}"


def step_task(step: str) -> str:
    """The task that runs one workflow step (each step is its own task, so queues show where work is)."""
    return f"remediation.step.{step}"


def make_app(settings: Settings) -> Celery:
    """A Celery app with the service's broker, queues and delivery guarantees, and no tasks.

    Late acks and ``reject_on_worker_lost`` requeue a task whose worker died; prefetch 1 keeps a
    worker from sitting on a step another could run; two queues keep an event storm from starving
    running workflows. Under ``broker.sentinel`` the broker is kombu's ``sentinel://`` transport with
    the master's name in its transport options, so workers and senders follow a failover.
    """
    app = Celery("remediation", broker=settings.broker.celery_url)
    app.conf.update(
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        task_acks_on_failure_or_timeout=True,
        worker_prefetch_multiplier=1,
        task_default_queue=WORKFLOW_QUEUE,
        task_routes={INGEST_TASK: {"queue": INGEST_QUEUE},
                     **{task: {"queue": REQUEST_QUEUE} for task in (RELEASE_TASK, RESUME_TASK, SWEEP_TASK,
                                                                    NOTIFY_TASK, PRUNE_TASK,
                                                                    REPAIR_REQUESTS_TASK)}},
        task_ignore_result=True,
        task_serializer="json",
        accept_content=["json"],
        broker_connection_retry_on_startup=True,
        broker_use_ssl=settings.broker.celery_tls() or None,
        redis_backend_use_ssl=settings.broker.celery_tls() or None,
        broker_transport_options=settings.broker.celery_transport_options(),
    )
    return app


_clients: dict[tuple[str, float, str, str, str], Celery] = {}


def client_app(settings: Settings) -> Celery:
    """The process's sending app for these broker settings (built once: an app holds a connection pool)."""
    b = settings.broker
    key = (b.celery_url, b.visibility_timeout_s, b.key_prefix, b.ca_file or "", b.sentinel.master)
    if key not in _clients:
        _clients[key] = make_app(settings)
    return _clients[key]


class CeleryDispatcher:
    """Queues a lever's or an ingest's follow-up work on the broker, after the caller committed.

    In a worker (``acts``): a remediation's first step, due now, goes in a ``remediation.isolate`` task
    with up to ``isolate_batch`` others, so the worker takes them all through isolation at once
    (workers/isolate.py); every other step is its own task. Isolate tasks go ahead of every other step
    (:data:`ISOLATION`), on the ``cluster``'s own queue when the caller names it (the ingest and the
    sweep do): a lone fault in one cluster is isolated next, however many nodes another cluster just
    lost. Anywhere else (the API, the CLI) the follow-ups go as one ``remediation.resume`` request on
    the ``requests`` queue."""

    def __init__(self, app: Celery, isolate_batch: int = 32, acts: bool = True) -> None:
        self._app = app
        self._isolate_batch = isolate_batch
        self._acts = acts

    def steps(self, followups: Sequence[FollowUp | None], cluster: str | None = None) -> None:
        if not self._acts:
            if ids := sorted({f.remediation_id for f in followups if f is not None}):
                self._app.send_task(RESUME_TASK, args=[ids], queue=REQUEST_QUEUE)
            return
        isolating = [f for f in followups if f is not None and f.step == FIRST and not f.countdown]
        ids = [f.remediation_id for f in isolating]
        for at in range(0, len(ids), self._isolate_batch):
            self._app.send_task(ISOLATE_TASK, args=[ids[at : at + self._isolate_batch]],
                                queue=isolate_queue(cluster) if cluster else WORKFLOW_QUEUE, priority=ISOLATION)
        for f in followups:
            if f is not None and f not in isolating:
                self._app.send_task(step_task(f.step), args=[f.remediation_id], kwargs=due_kwargs(f.due),
                                    countdown=f.countdown or None, queue=WORKFLOW_QUEUE, priority=LATER_STEP)

    def repairs(self, repair_ids: Sequence[int], countdown: float = 0.0) -> None:
        """Queue one look at each domain repair named, after ``countdown`` seconds."""
        for rid in repair_ids:
            self._app.send_task(DOMAIN_REPAIR_TASK, args=[rid], countdown=countdown or None, queue=WORKFLOW_QUEUE,
                                priority=LATER_STEP)

    def release(self, audit_id: int) -> None:
        self._app.send_task(RELEASE_TASK, args=[audit_id], queue=REQUEST_QUEUE)

    def kick_ingest(self, cluster: str | None = None) -> None:
        """Ask a worker to consume ``cluster``'s event streams, or every served cluster's when none is
        named (publishers call this after XADD)."""
        self._app.send_task(INGEST_TASK, kwargs={"cluster": cluster} if cluster else {}, queue=INGEST_QUEUE)


def due_kwargs(due: datetime | None) -> dict[str, str]:
    """A step task's keyword arguments: the schedule it was sent for, as text (FollowUp.due)."""
    return {"due": due.isoformat()} if due is not None else {}


def celery_dispatcher(settings: Settings, app: Celery | None = None) -> CeleryDispatcher:
    """The one way a process gets its dispatcher: over the process's sending app for these broker
    settings, or, in a worker, over the worker's own ``app`` (its tasks queue their follow-up work on
    the connection they already hold; broker, queues and routes are the same by construction). Only
    a worker's dispatcher queues steps itself."""
    return CeleryDispatcher(app or client_app(settings), settings.workflow.isolate_batch, acts=app is not None)
