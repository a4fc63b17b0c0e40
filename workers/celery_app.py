"""The worker side's Celery app: the broker app every side shares, plus the tasks and the beat schedule.

Broker settings, queues and routes come from :mod:`remediation.adapters.celery`. Tasks are ``acks_late``
and ``reject_on_worker_lost``, prefetch 1, on ``ingest`` and ``workflow`` queues. Settings are read once,
at import. Logging goes to :func:`remediation.adapters.logs.configure` through Celery's ``setup_logging``
signal.

Why: docs/running.md#the-workers
"""

from __future__ import annotations

import logging
from typing import Any

from celery import Celery
from celery.signals import celeryd_after_setup, celeryd_init, setup_logging
from celery.worker.consumer import Consumer as _CeleryConsumer

from remediation.adapters import logs
from remediation.adapters.celery import (
    INGEST_TASK,
    NOTIFY_TASK,
    PRUNE_TASK,
    REPAIR_REQUESTS_TASK,
    REQUEST_QUEUE,
    SWEEP_TASK,
    isolate_queue,
)
from remediation.adapters.celery import make_app as make_client_app
from remediation.adapters.preload import preload
from remediation.settings import Settings, load_settings
from remediation.workers import health, kick_relay

log = logging.getLogger(__name__)


def make_app(settings: Settings) -> Celery:
    """The broker's app (:func:`remediation.adapters.celery.make_app`) with this side's additions: the
    task modules, the broker-restart-proof consumer and the beat schedule."""
    app = make_client_app(settings)
    app.conf.update(
        include=["remediation.workers.tasks", "remediation.workers.notify_task", "remediation.workers.repair_task"],
        worker_hijack_root_logger=False,
        worker_consumer="remediation.workers.celery_app:Consumer",
        beat_schedule_filename=str(settings.broker.beat_schedule_file),  # `-s FILE` still overrides
        beat_schedule={
            # Beat writes the requests queue alone (remediation.adapters.celery): the ingest it asks
            # for there reads the stream, as one the kick relay queues on the ingest queue does.
            **sweeps(settings),
            **ingests(settings),
            "notify": {"task": NOTIFY_TASK, "schedule": 10.0},
        },
    )
    if settings.retention.prune_interval_s > 0:  # retention: old unlinked events (remediation db prune)
        app.conf.beat_schedule["prune-events"] = {
            "task": PRUNE_TASK,
            "schedule": settings.retention.prune_interval_s,
        }
    if settings.repair.enabled:  # the repair requests' outbox (remediation.repair_requests)
        app.conf.beat_schedule["repair-requests"] = {"task": REPAIR_REQUESTS_TASK, "schedule": 10.0}
    health.install(app, settings)
    kick_relay.install(app, settings)
    return app


def sweeps(settings: Settings) -> dict[str, dict[str, Any]]:
    """Beat's sweeps: one per cluster served (``sweep`` alone for a one-cluster site, as before)."""
    names = list(settings.fleet())
    every = settings.workflow.sweep_interval_s
    if len(names) == 1:
        return {"sweep": {"task": SWEEP_TASK, "schedule": every}}
    return {f"sweep-{name}": {"task": SWEEP_TASK, "schedule": every, "kwargs": {"cluster": name}} for name in names}


def ingests(settings: Settings) -> dict[str, dict[str, Any]]:
    """Beat's safety-net ingests, for a kick relay that is down: one per cluster served (one alone for
    a one-cluster site, as before)."""
    names = list(settings.fleet())
    every: dict[str, Any] = {"task": INGEST_TASK, "schedule": 5.0, "options": {"queue": REQUEST_QUEUE}}
    if len(names) == 1:
        return {"ingest-safety-net": every}
    return {f"ingest-safety-net-{name}": {**every, "kwargs": {"cluster": name}} for name in names}


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

    def ensure_connected(self, conn: Any) -> Any:
        """Celery's connect-with-retries, telling the health endpoint where the broker stands."""
        health.broker_connecting()
        conn = super().ensure_connected(conn)
        health.broker_connected()
        return conn

    def on_connection_error_after_connected(self, exc: Exception) -> None:
        health.broker_connecting()
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


@setup_logging.connect
def _our_logging(**_: Any) -> None:
    """Celery's logging set-up, replaced by the one every process shares."""
    logs.configure_from(settings)


@celeryd_init.connect
def _early_logging(**_: Any) -> None:
    """The worker warns (running as root, say) before it sets logging up: be in place by then."""
    logs.configure_from(settings)


@celeryd_init.connect
def _preload_adapters(**_: Any) -> None:
    """Import the adapters' SDKs once, before the pool forks (remediation.adapters.preload)."""
    preload(settings)


@celeryd_after_setup.connect
def _isolate_queues(instance: Any, **_: Any) -> None:
    """Consume each served cluster's isolate queue too, whatever ``-Q`` named (remediation.adapters.celery)."""
    for cluster in settings.fleet():
        instance.app.amqp.queues.select_add(isolate_queue(cluster))
