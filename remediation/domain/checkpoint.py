"""Checkpoint before the hammer: ask the jobs on a draining node to save their work, once.

Where ``workflow.checkpoint_signal`` is set and the fault's class allows it, ``slurm_drain`` signals
the jobs it finds and ``k8s_evict`` annotates the pods (:func:`ask_pods`, with
``workflow.checkpoint_pods``); ``on_jobs_timeout`` follows ``checkpoint_wait_s`` after the request.
The request and each job's signal are intents, sent at most once. :class:`CheckpointRequest` is the
typed record that ``nodes show`` and the dashboard render.

Why: docs/policy.md#checkpoint-before-the-hammer-ask-the-jobs-first-workflowcheckpoint_signal-off-by-default
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, Literal

from remediation.domain.causes import urgent
from remediation.domain.outcomes import Adapters, Note, StepInput, Wait, wait
from remediation.domain.states import AuditAction
from remediation.domain.step_records import DrainDetail
from remediation.domain.stepdetail import Json
from remediation.ports.errors import ConfigError, RemediationError
from remediation.settings import WorkflowSettings

#: The ``provider_op`` kind of a checkpoint request on a ``slurm_drain`` step row.
KIND = "checkpoint"


@dataclass(frozen=True)
class CheckpointRequest:
    """One request to the jobs on a node: recorded before it is sent, read back by every later run."""

    jobs: tuple[str, ...]
    signal: str  # as scancel takes it: USR1
    scope: Literal["batch", "full"]
    at: datetime  # when it was recorded (just before scancel ran)
    wait_s: int  # on_jobs_timeout applies (pods: eviction starts) this long after ``at``
    sent: bool | None = None  # True: every job confirmed; False: some never confirmed; None: in progress
    target: Literal["jobs", "pods"] = "jobs"  # Slurm jobs signalled, or pods annotated
    claimed: tuple[str, ...] = ()  # jobs whose signal was recorded before scancel ran for it
    signalled: tuple[str, ...] = ()  # jobs scancel confirmed

    @property
    def unsent(self) -> tuple[str, ...]:
        """The jobs no run has claimed yet: a later run sends these, and only these."""
        return tuple(j for j in self.jobs if j not in self.claimed)

    @property
    def lost(self) -> tuple[str, ...]:
        """Jobs claimed but never confirmed (a worker stopped while sending): never sent again."""
        return tuple(j for j in self.claimed if j not in self.signalled)

    @classmethod
    def load(cls, op: Mapping[str, Any] | None) -> CheckpointRequest | None:
        """The request on a step row's ``provider_op`` (None: there is none, or it is malformed)."""
        if not op or op.get("kind") != KIND:
            return None
        try:
            scope = op["scope"]
            if scope not in ("batch", "full"):
                return None
            sent = op.get("sent")
            jobs = tuple(str(j) for j in op["jobs"])
            # A request recorded before each signal was: what it sent is unknown, so all of it is claimed.
            claimed = tuple(str(j) for j in op["claimed"]) if "claimed" in op else jobs
            return cls(
                jobs,
                str(op["signal"]),
                scope,
                datetime.fromisoformat(op["at"]),
                int(op["wait_s"]),
                sent if isinstance(sent, bool) else None,
                "pods" if op.get("target") == "pods" else "jobs",
                claimed,
                tuple(str(j) for j in op.get("signalled") or ()),
            )
        except (KeyError, TypeError, ValueError):
            return None

    def dump(self) -> dict[str, Any]:
        return {
            "kind": KIND,
            "jobs": list(self.jobs),
            "signal": self.signal,
            "scope": self.scope,
            "at": self.at.isoformat(),
            "wait_s": self.wait_s,
            "sent": self.sent,
            "target": self.target,
            "claimed": list(self.claimed),
            "signalled": list(self.signalled),
        }

    def ends_at(self, drain_started: datetime, drain_timeout_s: float) -> float:
        """Seconds after ``drain_started`` when on_jobs_timeout applies: ``wait_s`` after the request,
        or the drain's own timeout if that comes first."""
        return min((self.at - drain_started).total_seconds() + self.wait_s, drain_timeout_s)

    def text(self, now: datetime, dry_run: bool = False) -> str:
        """'asked job 123 to checkpoint (USR1) 40 s ago; waiting up to 300 s'."""
        ago = max(0, int((now - self.at).total_seconds()))
        who = (
            f"{self.target[:-1]} {self.jobs[0]}"
            if len(self.jobs) == 1
            else f"{self.target} {', '.join(self.jobs[:5])}"
            + (f" (+{len(self.jobs) - 5} more)" if len(self.jobs) > 5 else "")
        )
        verb = "would have asked" if dry_run else "asked"
        how = self.signal if self.target == "jobs" else "annotation"
        lost = (
            ""
            if self.sent is not False
            else " (not confirmed: a worker stopped while asking; not asked again)"
        )
        return f"{verb} {who} to checkpoint ({how}) {ago} s ago; waiting up to {self.wait_s} s{lost}"


def send_unsent(key: str, ad: Adapters, request: CheckpointRequest) -> CheckpointRequest:
    """Signal each job no run has claimed, one at a time: claimed on the step row before scancel runs
    for it, confirmed after. A typed error from Slurm (it did not take the signal) takes the claim
    back and ends the run; the next run sends the rest, and none twice. Returns the request as sent."""
    assert ad.intents is not None
    for job in request.unsent:
        request = replace(request, claimed=(*request.claimed, job))
        ad.intents.settle(key, request.dump())
        try:
            ad.slurm.signal_jobs([job], request.signal, request.scope)
        except RemediationError:
            ad.intents.settle(key, replace(request, claimed=request.claimed[:-1]).dump())
            raise
        request = replace(request, signalled=(*request.signalled, job))
        ad.intents.settle(key, request.dump())
    return replace(request, sent=not request.lost)


def asks_checkpoint(fault_class: str | None, workflow: WorkflowSettings) -> bool:
    """Whether the jobs of a fault of this class get a checkpoint request."""
    if not workflow.checkpoint_signal:
        return False
    if workflow.checkpoint_classes is None:
        return not urgent(fault_class)
    return (fault_class or "unknown") in workflow.checkpoint_classes


def request_checkpoint(
    inp: StepInput,
    ad: Adapters,
    workflow: WorkflowSettings,
    *, jobs: list[str],
    detail: DrainDetail,
    now: datetime,
) -> Wait:
    """Claim the request as an intent, signal each job no run has claimed yet, and wait for the jobs to
    leave. A job claimed by an earlier run and never confirmed (a worker stopped while sending it) is
    never signalled again: it is recorded as not confirmed."""
    if ad.intents is None:
        raise ConfigError(
            "a checkpoint request is sent only where its intent can be recorded first (the "
            "process built its adapters without the database's intents)",
            component="slurm",
        )
    scope: Literal["batch", "full"] = workflow.checkpoint_scope
    request = CheckpointRequest(
        tuple(jobs), workflow.checkpoint_signal, scope, now, workflow.checkpoint_wait_s
    )
    first = (
        inp.provider_op
        if CheckpointRequest.load(inp.provider_op)
        else ad.intents.claim(inp.key, request.dump())
    )
    if first is not None:  # a request recorded before: this run sends only what no run claimed
        request = CheckpointRequest.load(first) or request
    request = send_unsent(inp.key, ad, request)
    how = f"signalled {request.signal} ({request.scope})"
    if request.lost:
        how += (f"; {', '.join(request.lost)} recorded but not confirmed (a worker stopped while sending; "
                "never sent twice)")
    why = (
        f"checkpoint request: {how} to {len(request.jobs)} job(s) ({', '.join(request.jobs)}) on {inp.node}; "
        f"on_jobs_timeout={workflow.on_jobs_timeout} applies {request.wait_s}s after it if they have not left"
    )
    ids: Json = {
        "jobs": list(request.jobs),
        "signal": request.signal,
        "scope": request.scope,
        "node": inp.node,
        "sent": request.sent,
    }
    return wait(
        workflow, why, detail=detail, provider_op=request.dump(), note=Note(AuditAction.CHECKPOINT_REQUESTED, why, ids)
    )


def ask_pods(
    inp: StepInput, ad: Adapters, workflow: WorkflowSettings, *, k8s_node: str, now: datetime
) -> Wait | None:
    """Before the first eviction (``workflow.checkpoint_pods``): annotate the pods it would remove
    with the request, and wait up to ``checkpoint_wait_s`` for them to leave. None: evict now (the
    class is not asked, no pod is left, or the wait is over). The request's time is claimed as an
    intent first, so a repeated run annotates with the same times, and a pod already annotated keeps
    its annotation: a pod is asked once."""
    if (
        not workflow.checkpoint_pods
        or ad.kube is None
        or not asks_checkpoint(inp.context.fault_class, workflow)
    ):
        return None
    recorded = CheckpointRequest.load(inp.provider_op)
    request = recorded
    if request is None:
        if ad.intents is None:
            raise ConfigError(
                "a checkpoint request is sent only where its intent can be recorded first",
                component="kubernetes",
            )
        ours = CheckpointRequest(
            (),
            workflow.checkpoint_signal,
            workflow.checkpoint_scope,
            now,
            workflow.checkpoint_wait_s,
            target="pods",
        )
        request = CheckpointRequest.load(ad.intents.claim(inp.key, ours.dump())) or ours
    if (now - request.at).total_seconds() >= request.wait_s:
        return None
    pods = ad.kube.request_checkpoint(k8s_node, request.at, request.at + timedelta(seconds=request.wait_s))
    if not pods:
        return None
    request = replace(request, jobs=tuple(pods), sent=True)
    why = (
        f"checkpoint request: annotated {len(pods)} pod(s) ({', '.join(pods[:5])}) on {k8s_node}; "
        f"evicting them {request.wait_s}s after it if they have not left"
    )
    note = (
        None
        if recorded is not None and recorded.sent
        else Note(AuditAction.CHECKPOINT_REQUESTED, why, {"pods": list(pods), "node": inp.node, "k8s_node": k8s_node})
    )
    return wait(
        workflow,
        f"{request.text(now)}; waiting for {len(pods)} pod(s) to leave",
        provider_op=request.dump(),
        note=note,
    )
