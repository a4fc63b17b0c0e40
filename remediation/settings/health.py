"""``health``: the health endpoint of the watchers, workers and beat (``REMEDIATION_HEALTH__*``)."""

from __future__ import annotations

from pydantic import Field

from remediation.settings.base import Section


class HealthSettings(Section):
    """The small HTTP endpoint every long-running process other than the API serves (watchers, workers,
    beat): ``/livez`` (the process's own loop still turns: restart it if not), ``/readyz`` (it does its
    job: a watcher's leader polls successfully, a standby waits; a worker holds its broker connection)
    and ``/metrics``. Off unless ``port`` is set; deploy/ and docker-compose.yml set it."""
    bind: str = Field(
        "127.0.0.1", description="Address of the health endpoint (0.0.0.0 in a pod: kubelet and Prometheus)."
    )
    port: int | None = Field(
        None, ge=0, le=65535, description="Port of the health endpoint; unset = no endpoint (0: any free port)."
    )
    liveness_stale_s: float = Field(
        120.0, gt=0, description="/livez fails once the process's own loop has not turned for this long."
    )
    readiness_stale_s: float = Field(
        600.0,
        gt=0,
        description="/readyz of a leading watcher fails once its last successful poll or watch response "
        "is older than this (above kube.watch_timeout_s: a quiet watch answers once per request).",
    )
