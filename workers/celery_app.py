"""The Celery app: Redis broker, late acks, and the beat schedule (sweeper and ingest safety net).

Every task is acknowledged only after it ran (``acks_late``) and is requeued if its worker process dies
(``reject_on_worker_lost``), so a killed worker loses no step; the steps themselves are idempotent (see
remediation.workflow). Prefetch is 1 so a worker never sits on a step another worker could run. Two
queues keep a storm of events from starving running workflows: ``ingest`` and ``workflow``.

Settings are read once, at import, and a bad configuration stops the worker at start-up with a message
naming the field.
"""

from __future__ import annotations

import logging

from celery import Celery
from celery.worker.consumer import Consumer as _CeleryConsumer

from remediation.settings import Settings, load_settings

log = logging.getLogger(__name__)

INGEST_QUEUE = "ingest"
WORKFLOW_QUEUE = "workflow"


def make_app(settings: Settings) -> Celery:
    app = Celery("remediation", broker=settings.broker.celery_url, include=["workers.tasks", "workers.notify_task"])
    prefix = settings.broker.key_prefix
    app.conf.update(
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        task_acks_on_failure_or_timeout=True,
        worker_prefetch_multiplier=1,
        task_default_queue=WORKFLOW_QUEUE,
        task_routes={"remediation.ingest": {"queue": INGEST_QUEUE}},
        task_ignore_result=True,
        task_serializer="json",
        accept_content=["json"],
        broker_connection_retry_on_startup=True,
        broker_transport_options={
            "visibility_timeout": settings.broker.visibility_timeout_s,
            "global_keyprefix": f"{prefix}:celery:",
        },
        worker_hijack_root_logger=False,
        worker_consumer="workers.celery_app:Consumer",
        beat_schedule={
            "sweep": {"task": "remediation.sweep", "schedule": settings.workflow.sweep_interval_s},
            "ingest-safety-net": {"task": "remediation.ingest", "schedule": 5.0},
            "notify": {"task": "remediation.notify", "schedule": 10.0},
        },
    )
    return app


class Consumer(_CeleryConsumer):  # type: ignore[misc]
    """Celery's consumer, surviving a broker restart while it holds unacknowledged tasks.

    On a lost broker connection Celery 5.7.0 calls ``connection.collect()``, which detaches the
    transport from its connection (``transport.client = None``), and then ``connection.close()``. Any
    use of the old channel after that, i.e. putting the unacknowledged (late-ack) messages back on
    close, or acknowledging a task that finishes after the reconnect, raises ``AttributeError``
    instead of a connection error, and the worker exits with "Unrecoverable error". Every worker with a
    task in hand died on a Redis restart (found by tests/reliability/test_restarts.py).

    Here the old transport keeps its connection settings, so the old channel fails like any lost
    connection while Redis is down (Celery ignores that) and works again once Redis is back: a task
    finishing after the reconnect is acknowledged normally instead of being redelivered after the
    visibility timeout.
    """

    def on_connection_error_after_connected(self, exc: Exception) -> None:
        connection = self.connection
        transport = getattr(connection, "_transport", None)

        def reattach() -> None:
            if transport is not None and transport.client is None:
                transport.client = connection

        if connection is not None:
            close = connection.close

            def close_attached() -> None:
                reattach()
                close()

            connection.close = close_attached
        super().on_connection_error_after_connected(exc)
        reattach()


settings = load_settings()
app = make_app(settings)


def kick_ingest() -> None:
    """Ask a worker to drain the event stream (publishers call this after XADD)."""
    app.send_task("remediation.ingest", queue=INGEST_QUEUE)
