"""Job safety: nothing destructive happens while Slurm shows jobs on the node.

A node has jobs if ``squeue -w NODE`` lists any, or if its Slurm state says so (ALLOCATED, MIXED,
COMPLETING, or the FAILING or DRAINING flag). :func:`no_jobs_left` is the check before eviction and
machine steps; :func:`jobs_timed_out` applies ``workflow.on_jobs_timeout`` after
``workflow.drain_timeout_s``; :func:`wait_for_jobs` brings it forward when jobs were asked to
checkpoint.

Why: docs/policy.md#job-safety-nothing-destructive-while-jobs-remain-on_jobs_timeout--hold
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime

from remediation.domain.checkpoint import CheckpointRequest, asks_checkpoint, request_checkpoint
from remediation.domain.outcomes import Adapters, Note, StepInput, Wait, elapsed, wait
from remediation.domain.slurm_states import BUSY
from remediation.domain.states import AuditAction
from remediation.domain.step_records import DrainDetail, EvictDetail, MachineDetail
from remediation.domain.stepdetail import Json
from remediation.ports.cluster import SlurmNode
from remediation.settings import WorkflowSettings


def jobs_text(jobs: list[str]) -> str:
    """"1 job (12345)", "3 jobs (1, 2, 3)", at most five ids."""
    shown = ", ".join(jobs[:5]) + (f", +{len(jobs) - 5} more" if len(jobs) > 5 else "")
    return f"{len(jobs)} job{'' if len(jobs) == 1 else 's'} ({shown})"


def jobs_holding(ad: Adapters, node: SlurmNode) -> tuple[list[str], str | None]:
    """The jobs on the node, and why it counts as busy (None: free). Busy if squeue lists jobs or
    Slurm's state still says allocated, mixed, completing, failing or draining."""
    jobs = ad.slurm.jobs_on(node.name)
    if jobs:
        return jobs, jobs_text(jobs)
    if node.states & BUSY:
        return [], f"Slurm still shows the node {'+'.join(sorted(node.states))} (squeue lists no job yet)"
    return [], None


def wait_for_jobs(inp: StepInput, ad: Adapters, workflow: WorkflowSettings, *, jobs: list[str], busy: str,
                  now: datetime) -> Wait:
    """The drain found the node busy: ask its jobs to checkpoint once (where the site and the fault's
    class allow it), wait for them to leave, and apply ``on_jobs_timeout`` at the deadline:
    ``checkpoint_wait_s`` after the request, or ``drain_timeout_s`` after the drain if that is sooner
    or nothing was asked."""
    detail = DrainDetail(tuple(jobs))
    request = CheckpointRequest.load(inp.provider_op)
    if (request is None and jobs and asks_checkpoint(inp.context.fault_class, workflow)) or (
            request is not None and request.sent is None):
        return request_checkpoint(inp, ad, workflow, jobs=jobs, detail=detail, now=now)
    deadline = float(workflow.drain_timeout_s)
    after = f"{workflow.drain_timeout_s}s after the drain"
    if request is not None and (ends := request.ends_at(inp.started_at, deadline)) < deadline:
        deadline, after = ends, f"{request.wait_s}s after the checkpoint request ({request.signal})"
    if elapsed(inp, now) <= deadline:
        waiting = f"waiting for {busy} to leave" if jobs else f"waiting: {busy}"
        return wait(workflow, f"{request.text(now)}; {waiting}" if request else waiting, detail=detail)
    return jobs_timed_out(inp, ad, workflow, overdue=Overdue(jobs, busy, after), detail=detail)


@dataclass(frozen=True)
class Overdue:
    """What is still on a node past its deadline: the job ids, how to name what keeps it busy, and which
    deadline passed (``after``)."""

    jobs: list[str]
    busy: str
    after: str


def jobs_timed_out(inp: StepInput, ad: Adapters, workflow: WorkflowSettings, *, overdue: Overdue,
                   detail: DrainDetail) -> Wait:
    """``workflow.on_jobs_timeout``: hold (stay drained, page once, keep waiting), requeue or cancel
    the jobs. Each writes an audit row naming the job ids; nothing here ever quarantines the node."""
    jobs, busy, after = overdue.jobs, overdue.busy, overdue.after
    policy = workflow.on_jobs_timeout
    # Each job is requeued or cancelled once: one still listed after that is leaving (completing) or
    # refused to go, and is waited for like under hold, never acted on (and paged about) again.
    progress = DrainDetail.load(inp.detail)
    acted = progress.acted or ()
    todo = [j for j in jobs if j not in acted]
    ids: Json = {"jobs": todo, "policy": policy, "node": inp.node}
    detail = replace(detail, acted=(*acted, *todo), timeout_paged=progress.timeout_paged)
    if policy in ("requeue", "cancel") and todo:
        (ad.slurm.requeue_jobs if policy == "requeue" else ad.slurm.cancel_jobs)(todo)
        verb, action = (("requeued", AuditAction.JOBS_REQUEUED) if policy == "requeue"
                        else ("cancelled", AuditAction.JOBS_CANCELLED))
        why = f"{verb} {jobs_text(todo)} still on {inp.node} {after}"
        return wait(workflow, f"{why}; waiting for them to leave", detail=detail, note=Note(action, why, ids))
    why = (f"{busy} still on {inp.node} {after}; on_jobs_timeout={policy}: the node stays "
           "drained and nothing destructive happens until the jobs leave or a human decides")
    return wait(workflow, f"held: {why}", detail=replace(detail, timeout_paged=True),
                 note=None if progress.timeout_paged else Note(AuditAction.JOBS_TIMEOUT, why, ids))


def no_jobs_left(inp: StepInput, ad: Adapters, workflow: WorkflowSettings, *, what: str,
                 record: type[EvictDetail | MachineDetail]) -> Wait | None:
    """Guard of every destructive step: nothing is evicted or restarted while Slurm shows jobs on the
    node (they can only be back if someone resumed it in Slurm); wait instead, the jobs on the step's
    ``record``."""
    jobs, busy = jobs_holding(ad, ad.slurm.get_node(inp.node))
    if busy is None:
        return None
    return wait(workflow, f"no {what} while jobs remain: waiting for {busy} to leave" if jobs
                 else f"no {what} while jobs may remain: {busy}", detail=record(jobs=tuple(jobs)))
