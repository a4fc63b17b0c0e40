"""The vocabulary of the state machine: node statuses, remediation statuses, steps and transitions.

Steps run ``slurm_drain``, ``k8s_cordon``, ``k8s_evict``, ``vm_restart``, ``verify``, ``validate``,
``return``, with escalation up the ladder and quarantine; :class:`Site` leaves out the steps of a half
the site lacks. ``TRANSITIONS`` lists every allowed step change; the engine refuses anything else.

Why: docs/architecture.md#the-workflows-steps-and-transitions
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class NodeStatus(StrEnum):
    HEALTHY = "healthy"
    UNHEALTHY = "unhealthy"  # seen bad, not remediated (human drain, ignored, paused...)
    REMEDIATING = "remediating"
    QUARANTINED = "quarantined"
    WITH_REPAIR = "with-repair"  # quarantined for hardware, and a repair request is open for it


#: The statuses of a node kept out of the pool until a human (or the repair system) lets it back.
QUARANTINE_STATUSES = frozenset({NodeStatus.QUARANTINED, NodeStatus.WITH_REPAIR})


class RemediationStatus(StrEnum):
    RUNNING = "running"  # a step is due or executing
    WAITING = "waiting"  # a step is waiting (jobs draining, operation, admission)
    SUCCEEDED = "succeeded"
    QUARANTINED = "quarantined"
    CANCELLED = "cancelled"
    FAILED = "failed"


OPEN_STATUSES = frozenset({RemediationStatus.RUNNING, RemediationStatus.WAITING})
CLOSED_STATUSES = frozenset(RemediationStatus) - OPEN_STATUSES


class Step(StrEnum):
    SLURM_DRAIN = "slurm_drain"
    K8S_CORDON = "k8s_cordon"
    K8S_EVICT = "k8s_evict"
    COLLECT_EVIDENCE = "collect_evidence"  # the node's state kept before the hammer (remediation.evidence_collection)
    VM_RESTART = "vm_restart"
    VERIFY = "verify"
    VALIDATE = "validate"  # the GPU validation (remediation.validation.rules)
    RETURN = "return"
    QUARANTINE = "quarantine"
    DONE = "done"  # terminal marker


# Steps that act on the machine; they wait while the breaker is open or the gap/concurrency is used up.
MACHINE_STEPS = frozenset({Step.VM_RESTART, Step.VERIFY})

HAPPY_PATH = (
    Step.SLURM_DRAIN,
    Step.K8S_CORDON,
    Step.K8S_EVICT,
    Step.COLLECT_EVIDENCE,
    Step.VM_RESTART,
    Step.VERIFY,
    Step.VALIDATE,
    Step.RETURN,
    Step.DONE,
)

TRANSITIONS: dict[Step, frozenset[Step]] = {
    Step.SLURM_DRAIN: frozenset({Step.K8S_CORDON, Step.COLLECT_EVIDENCE, Step.VM_RESTART, Step.VALIDATE, Step.RETURN,
                                 Step.QUARANTINE}),
    Step.K8S_CORDON: frozenset({Step.K8S_EVICT, Step.COLLECT_EVIDENCE, Step.QUARANTINE}),
    Step.K8S_EVICT: frozenset({Step.COLLECT_EVIDENCE, Step.VM_RESTART, Step.VALIDATE, Step.RETURN, Step.QUARANTINE}),
    Step.COLLECT_EVIDENCE: frozenset({Step.VM_RESTART, Step.VALIDATE, Step.RETURN, Step.QUARANTINE}),
    Step.VM_RESTART: frozenset({Step.VERIFY, Step.VM_RESTART, Step.COLLECT_EVIDENCE, Step.QUARANTINE}),
    Step.VERIFY: frozenset({Step.VALIDATE, Step.RETURN, Step.VM_RESTART, Step.COLLECT_EVIDENCE, Step.QUARANTINE}),
    Step.VALIDATE: frozenset({Step.RETURN, Step.VM_RESTART, Step.COLLECT_EVIDENCE, Step.QUARANTINE}),
    Step.RETURN: frozenset({Step.DONE, Step.COLLECT_EVIDENCE, Step.QUARANTINE}),
    Step.QUARANTINE: frozenset({Step.DONE}),
    Step.DONE: frozenset(),
}


class InvalidTransition(RuntimeError):
    pass


def check_transition(current: Step, nxt: Step) -> None:
    if nxt not in TRANSITIONS[current]:
        raise InvalidTransition(f"{current} -> {nxt} is not an allowed transition")


@dataclass(frozen=True)
class Site:
    """What a site has besides Slurm, which decides the steps a remediation takes there. A half the site
    lacks (its backend is ``none``) is no step at all: never faked, never recorded as done."""

    kubernetes: bool  # Nodes to cordon, evict and taint (kube.backend)
    machine: bool  # something can restart, move or reimage a node's machine (machine.backend)
    validation: bool  # a GPU check runs before return (validation.backend)

    def path(self, acts: bool = True, resets: bool = False, *, collects: bool = False) -> tuple[Step, ...]:
        """The steps in order. ``acts``: the class's ladder has a machine rung; a class without one is
        held for a human or quarantined (at k8s_evict, or at return), never restarted or checked.
        ``resets``: the rung is a GPU reset, a job on the node that needs no machine backend.
        ``collects``: the node's state is kept before its first machine action (``evidence``), where a
        job can run on the node."""
        skipped = set() if self.kubernetes else {Step.K8S_CORDON, Step.K8S_EVICT}
        if not (acts and (self.machine or resets)):
            skipped |= {Step.VM_RESTART, Step.VERIFY}
        if not (collects and self.validation) or Step.VM_RESTART in skipped:
            skipped.add(Step.COLLECT_EVIDENCE)  # without a validation no job runs: the remediation says so
        if not (acts and self.validation):
            skipped.add(Step.VALIDATE)
        return tuple(s for s in HAPPY_PATH if s not in skipped)


def next_on_success(step: Step, site: Site, acts: bool = True, *, resets: bool = False,
                    collects: bool = False) -> Step:
    """The step after ``step`` succeeds: the next one on the site's path."""
    path = site.path(acts, resets, collects=collects)
    return next(s for s in HAPPY_PATH[HAPPY_PATH.index(step) + 1:] if s in path)
