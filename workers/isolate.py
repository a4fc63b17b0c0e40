"""Isolation at fleet speed: many remediations taken out of the schedulers' hands at once.

When a rack's power or a spine switch fails, hundreds of remediations open in one ingest, and what
matters is how soon every one of those nodes is drained in Slurm and cordoned in Kubernetes, so that no
new job lands on a dead node. One task per step would queue them: each node's drain behind every other
node's, and every cordon behind all the drains, at a step or two per worker process at a time.

``remediation.isolate`` takes a batch of newly opened remediations (the dispatcher groups them,
``workflow.isolate_batch``) through their isolation steps, ``workflow.isolate_threads`` at a time: each
thread runs one remediation's ``slurm_drain`` and, the moment it is done, its ``k8s_cordon``, through
the same engine (``Workflow.run``: claim, act, record; idempotent and crash-safe as any step). The
threads' Slurm reads and drains merge into commands that carry many nodes
(:mod:`remediation.adapters.slurm.merged`). What comes after isolation, or a step that must wait (jobs
still running, a retry), is queued as its own task, as always.

A worker killed mid-batch loses nothing: the task is acknowledged late, so it is delivered again, and a
step already done is not done twice (the engine's claim sees it); the sweeper covers the rest.
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
