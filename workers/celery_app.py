"""The Celery app: Redis broker, late acks, and the beat schedule (sweeper and ingest safety net).

Every task is acknowledged only after it ran (``acks_late``) and is requeued if its worker process dies
(``reject_on_worker_lost``), so a killed worker loses no step; the steps themselves are idempotent (see
remediation.workflow). Prefetch is 1 so a worker never sits on a step another worker could run. Two
queues keep a storm of events from starving running workflows: ``ingest`` and ``workflow``.

Settings are read once, at import, and a bad configuration stops the worker at start-up with a message
naming the field.
"""

from __future__ import annotations

from celery import Celery

from remediation.settings import Settings, load_settings

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
        beat_schedule={
            "sweep": {"task": "remediation.sweep", "schedule": settings.workflow.sweep_interval_s},
            "ingest-safety-net": {"task": "remediation.ingest", "schedule": 5.0},
            "notify": {"task": "remediation.notify", "schedule": 10.0},
        },
    )
    return app


settings = load_settings()
app = make_app(settings)


def kick_ingest() -> None:
    """Ask a worker to drain the event stream (publishers call this after XADD)."""
    app.send_task("remediation.ingest", queue=INGEST_QUEUE)
