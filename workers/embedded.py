"""The embedded mode: the whole service in one process, with no servers to install.

SQLite (same Alembic scripts), Celery's ``memory://`` with a real worker thread, an in-process event bus
(:mod:`remediation.adapters.memstream`), and whatever cluster the settings name. ``configure_environment``
must run before :mod:`remediation.workers.celery_app` is first imported.

Why: docs/architecture.md#embedded-mode-and-the-simulated-cluster
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

EMBEDDED_ENV = {
    "REMEDIATION_BROKER__REDIS_URL": "memory://",
    "REMEDIATION_BROKER__CELERY_BROKER_URL": "memory://",
    "REMEDIATION_SLURM__BACKEND": "memory",
    "REMEDIATION_KUBE__BACKEND": "memory",
    "REMEDIATION_MACHINE__BACKEND": "memory",
}


def configure_environment(workdir: Path, overrides: dict[str, str] | None = None) -> None:
    """Point every setting at embedded backends unless the user already chose something."""
    workdir.mkdir(parents=True, exist_ok=True)
    defaults = {**EMBEDDED_ENV, "REMEDIATION_DATABASE__URL": f"sqlite:///{workdir / 'remediation.db'}"}
    defaults.update(overrides or {})
    for key, value in defaults.items():
        os.environ.setdefault(key, value)


@dataclass
class Embedded:
    """Running pieces of the embedded service; ``stop`` ends them all."""

    threads: list[threading.Thread] = field(default_factory=list)
    stop_event: threading.Event = field(default_factory=threading.Event)
    worker: Any = None

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop the worker (its running tasks finish first) and the periodic duties, and wait for their
        threads: the process may exit only once nothing of ours runs."""
        self.stop_event.set()
        if self.worker is not None:
            try:
                self.worker.stop(in_sighandler=False)
            except Exception:  # pragma: no cover - best effort at shutdown
                logging.getLogger(__name__).debug("worker stop", exc_info=True)
        join_all(self.threads, timeout_s, "the embedded service")


def join_all(threads: list[threading.Thread], timeout_s: float, what: str) -> None:
    """Wait for each thread to end; one still running after ``timeout_s`` (all together) is an error."""
    deadline = time.monotonic() + timeout_s
    for thread in threads:
        thread.join(timeout=max(0.0, deadline - time.monotonic()))
    if stuck := [t.name for t in threads if t.is_alive()]:
        raise RuntimeError(f"{what} could not stop: {', '.join(stuck)} still running after {timeout_s:g} s")


def start(concurrency: int = 4) -> Embedded:
    """Migrate the database, then start a Celery worker thread and the periodic sweeper/ingest."""
    from remediation.adapters.celery import INGEST_QUEUE, INGEST_TASK, SWEEP_TASK, WORKER_QUEUES
    from remediation.db.migrate import upgrade
    from remediation.workers.celery_app import app, settings

    if not settings.broker.celery_embedded:
        raise RuntimeError("embedded mode needs the memory:// broker (call configure_environment first)")
    upgrade(settings.database.url)
    app.conf.worker_redirect_stdouts = False  # the demo prints its own report
    # kombu's in-memory transport sleeps this long whenever the worker's prefetch slots are full or
    # the queue is empty (1 s by default): a step's follow-up then waits in line for whole seconds, and
    # a few dozen waiting steps polling at once queue up behind those sleeps. In-process, 0.05 s costs
    # nothing.
    app.conf.broker_transport_options = {**(app.conf.broker_transport_options or {}), "polling_interval": 0.05}
    emb = Embedded()
    worker = app.Worker(
        pool="threads", concurrency=concurrency, queues=list(WORKER_QUEUES), loglevel="WARNING",
        without_heartbeat=True, without_mingle=True, without_gossip=True, quiet=True,
        hostname="embedded@localhost",
    )
    emb.worker = worker
    emb.threads.append(threading.Thread(target=worker.start, name="celery-worker", daemon=True))

    def beat() -> None:
        # The periodic duties Celery beat has in production: sweeper and ingest safety net.
        next_sweep = 0.0
        while not emb.stop_event.wait(1.0):
            app.send_task(INGEST_TASK, queue=INGEST_QUEUE)
            if time.monotonic() >= next_sweep:
                app.send_task(SWEEP_TASK)
                next_sweep = time.monotonic() + settings.workflow.sweep_interval_s

    emb.threads.append(threading.Thread(target=beat, name="beat", daemon=True))
    for t in emb.threads:
        t.start()
    return emb
