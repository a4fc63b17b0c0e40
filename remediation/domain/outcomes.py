"""What a workflow step gets and what it returns: the adapters, a frozen snapshot of its remediation,
and the outcomes the engine persists (see :mod:`remediation.domain.step_bodies` for the steps themselves).

Kept apart from the step bodies so that the helpers each step family uses (job safety in
:mod:`remediation.domain.jobsafety`) share them without importing one another.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from remediation.domain.context import RemediationContext
from remediation.domain.statemachine import Site
from remediation.domain.states import AuditAction
from remediation.domain.step_records import StepDetail
from remediation.domain.stepdetail import Json, Stored
from remediation.evidence_collection.settings import EvidenceSettings
from remediation.ports.cluster import KubeNode, KubeNodes, MachineProvider, SlurmControl
from remediation.ports.errors import ConfigError
from remediation.ports.intents import Intents
from remediation.ports.rack import RackPower
from remediation.settings import PolicySettings, Settings, ValidationSettings, WorkflowSettings
from remediation.validation.port import Validator


@dataclass(frozen=True)
class Adapters:
    slurm: SlurmControl
    kube: KubeNodes | None  # kube.backend none: the site has no Kubernetes
    machine: MachineProvider | None  # machine.backend none: nothing can act on a node's machine
    validator: Validator | None = None  # validation.backend none: no validation
    # Where an action that must not be sent twice is claimed first (a checkpoint request); None: a
    # process without the database (such a request is then refused, never sent unrecorded).
    intents: Intents | None = None
    # The racks' power (redfish.chassis): a domain repair's power cycle; None: no chassis is known.
    rack: RackPower | None = None

    @property
    def site(self) -> Site:
        """What this site has, as the adapters the factory built say: a step is taken only where its
        adapter exists."""
        return Site(kubernetes=self.kube is not None, machine=self.machine is not None,
                    validation=self.validator is not None)

    def node_now(self, slurm_node: str, k8s_node: str | None = None) -> KubeNode | None:
        """The Kubernetes Node of ``slurm_node`` as it is now (None: the site has no Kubernetes)."""
        if self.kube is None:
            return None
        return self.kube.get(k8s_node or self.kube.node_for(slurm_node))

    def kubernetes(self, step: str) -> KubeNodes:
        """The Kubernetes adapter of a step that cannot be taken without one. A site without
        Kubernetes has no such step on its path; one reached anyway (the site's settings changed
        under a running remediation) is a configuration fault: automation pauses, nothing is faked."""
        if self.kube is None:
            raise ConfigError(f"{step} ran without Kubernetes (kube.backend none)", component="kubernetes")
        return self.kube


@dataclass(frozen=True)
class StepSettings:
    """The sections a step body reads, and nothing else: the steps decide on the policy (our reason
    prefix, the fault classes' ladders), the workflow's timeouts and the GPU check's, never on where the
    database or the broker is. A step is tested with these three sections alone."""

    policy: PolicySettings
    workflow: WorkflowSettings
    validation: ValidationSettings
    evidence: EvidenceSettings = field(default_factory=EvidenceSettings)

    @classmethod
    def of(cls, settings: Settings) -> StepSettings:
        return cls(settings.policy, settings.workflow, settings.validation, settings.evidence)


@dataclass(frozen=True)
class StepInput:
    remediation_id: int
    node: str
    cause: str
    ladder: int
    context: RemediationContext
    key: str  # idempotency key of this attempt
    attempt: int
    started_at: datetime  # when this attempt started (timeouts count from here)
    checks: int
    provider_op: dict[str, Any] | None
    detail: Stored  # the step row's detail as stored: the step's record and the engine's keys
    source: str = ""  # where the opening event came from: slurm, kubernetes or manual
    held_s: float = 0.0  # time this attempt was held (pause, breaker, system error): never its own


@dataclass(frozen=True)
class Note:
    """An audit row the engine writes with the outcome (and so pages through notify when the action
    is notifiable): what a step did or decided that on-call must hear about, such as jobs requeued."""

    action: AuditAction
    reason: str
    detail: Json = field(default_factory=dict)  # the audit row's detail (job ids, the policy)


@dataclass(frozen=True)
class Done:
    outcome: str
    # What the step learnt; the fields it sets replace the stored ones (RemediationContext.merged).
    context: RemediationContext = field(default_factory=RemediationContext)
    detail: StepDetail | None = None  # the step's record, merged into its row (None: nothing to add)
    note: Note | None = None


@dataclass(frozen=True)
class Wait:
    reason: str
    countdown: float
    provider_op: dict[str, Any] | None = None
    detail: StepDetail | None = None
    note: Note | None = None


@dataclass(frozen=True)
class Escalate:
    reason: str
    detail: StepDetail | None = None  # recorded on the failed step row
    # The engine gave up on transient errors (not the step's verdict on the node): the failure streak
    # on the step row is kept as the record of why, where any other outcome ends it.
    gave_up: bool = False


@dataclass(frozen=True)
class Hold:
    """Keep the node out and stop here until a human decides (``resume`` lifts it, ``cancel`` ends
    it), paging once: the outcome nobody can read as a verdict on the node, such as a GPU check that
    never finished."""

    reason: str
    kind: str
    detail: StepDetail | None = None


@dataclass(frozen=True)
class Quarantine:
    reason: str


@dataclass(frozen=True)
class Cancel:
    """Stop, undo nothing: a human took the node back (e.g. uncordoned it mid-remediation), or the
    signal that opened the remediation no longer holds (``node_healthy``)."""

    reason: str
    node_healthy: bool = False


Outcome = Done | Wait | Escalate | Quarantine | Cancel | Hold


class StepFn(Protocol):
    """A step body: one attempt at one step, at ``now``."""

    def __call__(self, inp: StepInput, ad: Adapters, cfg: StepSettings, *, now: datetime) -> Outcome: ...


def elapsed(inp: StepInput, now: datetime) -> float:
    """The attempt's own time, which its timeout counts: since it started, less the time it was held
    (a pause stops the clock: a step resumed after one never escalates on time it did not have)."""
    return (now - inp.started_at).total_seconds() - inp.held_s


def wait(workflow: WorkflowSettings, reason: str, hint: float | None = None, *,
         provider_op: dict[str, Any] | None = None, detail: StepDetail | None = None, note: Note | None = None) -> Wait:
    """Check again after the poll interval (or the hint, e.g. a Retry-After), never past max_wait_s."""
    countdown = min(max(hint or 0.0, workflow.poll_interval_s), workflow.max_wait_s)
    return Wait(reason, countdown, provider_op, detail, note)
