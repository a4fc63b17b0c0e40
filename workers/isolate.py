"""Isolation at fleet speed: many remediations taken out of the schedulers' hands at once.

``remediation.isolate`` takes a batch of newly opened remediations (``workflow.isolate_batch``) through
``slurm_drain`` then ``k8s_cordon``, ``workflow.isolate_threads`` at a time, each step through
``Workflow.run``. What follows isolation is queued as its own task. The task is acknowledged late.

Why: docs/architecture.md#a-mass-failure-is-isolated-in-batches
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from remediation.domain.statemachine import Step
from remediation.ports.dispatch import FollowUp
from remediation.services.workflow import RetryLater, Workflow

log = logging.getLogger(__name__)

ISOLATION = frozenset({Step.SLURM_DRAIN.value, Step.K8S_CORDON.value})


def isolate(workflow: Workflow, remediation_ids: Sequence[int], threads: int) -> list[FollowUp | None]:
    """Take each remediation through its isolation steps; return what to queue after."""
    if not remediation_ids:
        return []
    with ThreadPoolExecutor(min(threads, len(remediation_ids)), thread_name_prefix="isolate") as pool:
        return list(pool.map(lambda rid: _through(workflow, rid, workflow.settings.workflow.backoff_base_s),
                             remediation_ids))  # fmt: skip


def _through(workflow: Workflow, rid: int, backoff_s: float) -> FollowUp | None:
    step = Step.SLURM_DRAIN.value
    while True:
        try:
            followup = workflow.run(rid, step)
        except RetryLater as exc:  # the engine recorded the error and when to try again
            return FollowUp(rid, step, exc.countdown)
        except Exception:  # our own plumbing (the database, say): this step again, as its own task
            log.exception("remediation %d: %s failed in isolation; queued again as its own task", rid, step)
            return FollowUp(rid, step, backoff_s)
        if followup is None or followup.countdown or followup.step not in ISOLATION:
            return followup
        step = followup.step
