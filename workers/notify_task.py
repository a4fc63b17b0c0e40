"""The beat-driven notification task: one outbox pass over the audit log (see remediation.services.notify).

Thin on purpose: the pass owns its transaction and the cursor lock, so overlapping runs (a slow
webhook, two beat ticks) simply queue behind each other and never post the same row twice.

Why: docs/on-call.md#on-call
"""

from __future__ import annotations

import logging

from remediation.adapters.celery import NOTIFY_TASK
from remediation.services.notify import run_pass
from remediation.workers.celery_app import app, settings
from remediation.workers.context import runtime
from remediation.workers.tasks import DomainTask

log = logging.getLogger(__name__)


@app.task(name=NOTIFY_TASK, base=DomainTask, bind=True, ignore_result=True)
def notify(self: DomainTask) -> int:
    result = run_pass(runtime(settings).sessions, settings.notify)
    if result.sent or result.failed:
        log.info("notify: sent %d, collapsed %d, suppressed %d%s", result.sent, result.collapsed,
                 result.suppressed, " (post failed; retrying next pass)" if result.failed else "")
    return result.sent
