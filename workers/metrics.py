"""Prometheus metrics of the worker processes (the API exposes the domain-level gauges)."""

from __future__ import annotations

from prometheus_client import Counter

TASKS = Counter("remediation_tasks_total", "Celery tasks by name and result", ["task", "result"])
