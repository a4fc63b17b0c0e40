"""The worker's and beat's health endpoint (``/livez``, ``/readyz``, ``/metrics`` on ``health.port``).

Worker: a timer on its event loop is the heartbeat; readiness is the broker connection; task counters
(``remediation_worker_tasks_total``) use prometheus_client's multiprocess mode, set up by
:class:`HealthStep` before the pool forks. Beat: :class:`BeatScheduler` records ticks and sends.

Why: docs/running.md#the-workers
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from celery import Celery, bootsteps, signals
from celery.beat import PersistentScheduler

from remediation.settings import HealthSettings, Settings

if TYPE_CHECKING:
    from prometheus_client import Counter

    from remediation.adapters.health import HealthServer

log = logging.getLogger(__name__)

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
TICK_S = 5.0  # how often the event loop touches the worker's heartbeat


class WorkerHealth:
    """The main process's view: the event loop's heartbeat and the broker connection."""

    def __init__(self, settings: HealthSettings) -> None:
        self.s = settings
        self._turned = time.monotonic()
        self.connected = False
        self.connecting = False

    def turned(self) -> None:
        self._turned = time.monotonic()

    def live(self) -> tuple[bool, dict[str, Any]]:
        age = time.monotonic() - self._turned
        ok = age < self.s.liveness_stale_s or self.connecting
        return ok, {"loop_age_s": round(age, 3), "broker": self._broker()}

    def ready(self) -> tuple[bool, dict[str, Any]]:
        age = time.monotonic() - self._turned
        return self.connected and age < self.s.liveness_stale_s, {
            "loop_age_s": round(age, 3),
            "broker": self._broker(),
        }

    def _broker(self) -> str:
        return "connected" if self.connected else "connecting" if self.connecting else "disconnected"


_settings: Settings | None = None
_worker: WorkerHealth | None = None
_tasks: Counter | None = None


def install(app: Celery, settings: Settings) -> None:
    """Give ``app``'s workers the health step and its beat the heartbeat scheduler."""
    global _settings
    _settings = settings
    app.steps["worker"].add(HealthStep)
    app.conf.beat_scheduler = "remediation.workers.health:BeatScheduler"


def broker_connecting() -> None:
    if _worker is not None:
        _worker.connected, _worker.connecting = False, True


def broker_connected() -> None:
    if _worker is not None:
        _worker.connected, _worker.connecting = True, False
        _worker.turned()


def _remove_if_main(path: str, main: int) -> None:
    if os.getpid() == main:  # never from a forked pool child
        shutil.rmtree(path, ignore_errors=True)


def _multiprocess_dir() -> str:
    path = os.environ.get(MULTIPROC_ENV)
    if not path:
        path = tempfile.mkdtemp(prefix="remediation-worker-metrics-")
        os.environ[MULTIPROC_ENV] = path
        atexit.register(_remove_if_main, path, os.getpid())
    for stale in Path(path).glob("*.db"):
        stale.unlink()
    return path


class HealthStep(bootsteps.StartStopStep):  # type: ignore[misc]
    """Serve the endpoint from the worker's main process; touch the heartbeat from its event loop. The
    server's thread starts after the pool and the beat have forked (see remediation.workers.kick_relay)."""

    requires = ("celery.worker.components:Timer", "celery.worker.components:Pool",
                "celery.worker.components:Beat")

    def __init__(self, w: Any, **kwargs: Any) -> None:
        global _worker, _tasks
        super().__init__(w, **kwargs)
        self.server: HealthServer | None = None
        self.enabled = _settings is not None and _settings.health.port is not None
        if not self.enabled or _settings is None:
            return
        path = _multiprocess_dir()  # before prometheus_client's first import and before the pool forks
        from prometheus_client import Counter, values

        if values.ValueClass is values.MutexValue:  # imported before the directory was known
            log.warning(
                "prometheus_client was imported before %s was set: task counters are per process", path
            )
        _worker = WorkerHealth(_settings.health)
        if _tasks is None:  # once per process: the default registry refuses a second registration
            _tasks = Counter(
                "remediation_worker_tasks",
                "Tasks finished by this worker's processes, by outcome.",
                ["task", "outcome"],
            )
        for name in w.app.tasks:
            if not name.startswith("celery."):
                for outcome in ("succeeded", "failed", "retried"):
                    _tasks.labels(name, outcome)  # present at 0 from the start, so rate() has a base

    def start(self, w: Any) -> None:
        port = _settings.health.port if _settings is not None else None
        if not self.enabled or _worker is None or _settings is None or port is None:
            return
        from prometheus_client import CollectorRegistry
        from prometheus_client.multiprocess import MultiProcessCollector

        from remediation.adapters.health import HealthServer

        registry = CollectorRegistry()
        MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        _worker.turned()
        w.timer.call_repeatedly(TICK_S, _worker.turned)
        self.server = HealthServer(_settings.health.bind, port, _worker.live, ready=_worker.ready,
                                   registry=registry).start()

    def stop(self, w: Any) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None


def _count(task: Any, outcome: str) -> None:
    if _tasks is not None and getattr(task, "name", None):
        _tasks.labels(task.name, outcome).inc()


@signals.task_success.connect(weak=False)
def _succeeded(sender: Any = None, **_: Any) -> None:
    _count(sender, "succeeded")


@signals.task_failure.connect(weak=False)
def _failed(sender: Any = None, **_: Any) -> None:
    _count(sender, "failed")


@signals.task_retry.connect(weak=False)
def _retried(sender: Any = None, **_: Any) -> None:
    _count(sender, "retried")


_embedded_beat = False


@signals.beat_embedded_init.connect(weak=False)
def _beat_is_embedded(**_: Any) -> None:
    global _embedded_beat
    _embedded_beat = True


class BeatScheduler(PersistentScheduler):  # type: ignore[misc]
    """Celery's persistent scheduler, recording its ticks and sends for the beat's health endpoint."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._ticked = time.monotonic()
        self._sent_ok = True
        self._server: HealthServer | None = None
        self._started = False
        self._closed = False
        self._tick_gauge: Any = None

    def setup_schedule(self) -> None:
        # The state directory (broker.beat_state_dir) need not exist yet; shelve creates only the files.
        Path(self.schedule_filename).parent.mkdir(parents=True, exist_ok=True)
        super().setup_schedule()

    def tick(self, *args: Any, **kwargs: Any) -> float:
        """One scheduler pass; after :meth:`close`, the end of beat instead.

        Celery's SIGTERM handler closes the schedule's shelf, then raises SystemExit in the main thread.
        Under load the exit was seen lost mid-pass, and the next pass read the closed shelf: a traceback,
        not a log line, and a non-zero exit. A pass after the close ends beat as the signal meant to."""
        if self._closed:
            raise SystemExit(0)
        if not self._started:
            self._started = True
            self._serve()
        try:
            interval: float = super().tick(*args, **kwargs)
        except ValueError:  # shelve's "invalid operation on closed shelf", closed by the signal mid-pass
            if self._closed:
                raise SystemExit(0) from None
            raise
        self._ticked = time.monotonic()
        if self._tick_gauge is not None:
            self._tick_gauge.set(time.time())
        return interval

    def apply_async(self, *args: Any, **kwargs: Any) -> Any:
        try:
            result = super().apply_async(*args, **kwargs)
        except Exception:
            self._sent_ok = False
            raise
        self._sent_ok = True
        return result

    def close(self) -> None:
        """Stop the health server and save and close the schedule, once (the SIGTERM handler closes it,
        and beat's own shutdown closes it again)."""
        if self._closed:
            return
        self._closed = True
        if self._server is not None:
            self._server.stop()
            self._server = None
        super().close()

    def live(self) -> tuple[bool, dict[str, Any]]:
        age = time.monotonic() - self._ticked
        stale = _settings.health.liveness_stale_s if _settings else 120.0
        return age < stale, {"tick_age_s": round(age, 3)}

    def ready(self) -> tuple[bool, dict[str, Any]]:
        ok, body = self.live()
        return ok and self._sent_ok, {**body, "last_send": "ok" if self._sent_ok else "failed"}

    def _serve(self) -> None:
        port = _settings.health.port if _settings is not None else None
        if _embedded_beat or _settings is None or port is None:
            return
        from prometheus_client import CollectorRegistry, Gauge

        from remediation.adapters.health import HealthServer

        registry = CollectorRegistry()
        self._tick_gauge = Gauge(
            "remediation_beat_last_tick_timestamp_seconds",
            "Unix time of celery beat's last scheduler tick.",
            registry=registry,
        )
        self._server = HealthServer(_settings.health.bind, port, self.live, ready=self.ready,
                                    registry=registry).start()
