"""Placeholder replaced by the notifications work (issue 6): the beat entry 'notify' points here."""

from __future__ import annotations

from workers.celery_app import app


@app.task(name="remediation.notify")
def notify() -> int:
    return 0
