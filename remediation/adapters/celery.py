"""The broker as a client sees it: one Celery app that only *sends* tasks, by name.

Watchers kick the ingest, and the CLI and the API hand a lever's follow-up work to the workers, without
importing the workers: a task is addressed by its name (``remediation.ingest``, ``remediation.step.<step>``,
``remediation.release``), exactly as a worker on another machine would be. The worker process
(``workers.celery_app``) builds on :func:`make_app`, so the broker settings, queues and routes a
client sends with are the ones the workers consume with, by construction.

Task names, not modules, are the contract between the two sides; they are listed here once.
"""

from __future__ import annotations

from collections.abc import Sequence

from celery import Celery

from remediation.ports.dispatch import FollowUp
from remediation.settings import Settings

INGEST_QUEUE = "ingest"
WORKFLOW_QUEUE = "workflow"
INGEST_TASK = "remediation.ingest"
RELEASE_TASK = "remediation.release"
SWEEP_TASK = "remediation.sweep"
NOTIFY_TASK = "remediation.notify"
PRUNE_TASK = "remediation.prune"


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
        task_routes={INGEST_TASK: {"queue": INGEST_QUEUE}},
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
    """Queues a lever's or an ingest's follow-up work on the broker, after the caller committed."""

    def __init__(self, app: Celery) -> None:
        self._app = app

    def steps(self, followups: Sequence[FollowUp | None]) -> None:
        for f in followups:
            if f is not None:
                self._app.send_task(step_task(f.step), args=[f.remediation_id],
                                    countdown=f.countdown or None, queue=WORKFLOW_QUEUE)

    def release(self, node: str) -> None:
        self._app.send_task(RELEASE_TASK, args=[node], queue=WORKFLOW_QUEUE)

    def kick_ingest(self) -> None:
        """Ask a worker to drain the event stream (publishers call this after XADD)."""
        self._app.send_task(INGEST_TASK, queue=INGEST_QUEUE)


def celery_dispatcher(settings: Settings, app: Celery | None = None) -> CeleryDispatcher:
    """The one way a process gets its dispatcher: over the process's sending app for these broker
    settings, or, in a worker, over the worker's own ``app`` (its tasks queue their follow-up work on
    the connection they already hold; broker, queues and routes are the same by construction)."""
    return CeleryDispatcher(app or client_app(settings))
