"""The beat-driven repair request task: one delivery pass (see remediation.repair_requests.service).

Thin on purpose: the pass takes each due request's lease in its own transaction, so overlapping runs
never send one request twice at once; a failed delivery is recorded with its backoff.

Why: docs/policy.md#repair-requests-handing-hardware-to-the-repair-system
"""

from __future__ import annotations

import logging

from remediation.adapters.celery import REPAIR_REQUESTS_TASK
from remediation.adapters.repair_system import NoopRepairSystem, repair_system
from remediation.clock import SystemClock
from remediation.repair_requests.service import deliver_due
from remediation.workers.celery_app import app, settings
from remediation.workers.context import runtime
from remediation.workers.tasks import DomainTask

log = logging.getLogger(__name__)


@app.task(name=REPAIR_REQUESTS_TASK, base=DomainTask, bind=True, ignore_result=True)
def repair_requests(self: DomainTask) -> int:
    cfg = settings.repair
    done = deliver_due(runtime(settings).sessions, repair_system(cfg, dry_run=settings.dry_run), cfg,
                       clock=SystemClock(), noop=NoopRepairSystem())
    if done.delivered or done.failed:
        log.info("repair requests: delivered %d, failed %d (retried with backoff)", len(done.delivered),
                 len(done.failed))
    return len(done.delivered)
