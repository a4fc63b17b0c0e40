"""The vocabulary of the state machine: node statuses, remediation statuses, steps and transitions.

The workflow is linear with branches:

    slurm_drain -> k8s_cordon -> k8s_evict -> vm_restart -> verify -> validate -> return -> (succeeded)
                                                  ^            |          |
                                                  +-- escalate-+----------+   (verify or the GPU check
                                                                               failed: next ladder action)
    validate is skipped (verify -> return) when ``validation.backend`` is ``none``.
    any step --permanent error / ladder exhausted--> quarantine -> (quarantined)
    any step --human cancel--------------------------------------> (cancelled)
    quarantine step failing --------------------------------------> (failed)

``TRANSITIONS`` lists every allowed step change; the engine refuses anything else, so a bug shows up as
a loud error rather than a skipped step.
"""

from __future__ import annotations

from enum import StrEnum


class NodeStatus(StrEnum):
    HEALTHY = "healthy"
    UNHEALTHY = "unhealthy"  # seen bad, not remediated (human drain, ignored, paused...)
    REMEDIATING = "remediating"
    QUARANTINED = "quarantined"


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
    VM_RESTART = "vm_restart"
    VERIFY = "verify"
    VALIDATE = "validate"  # the GPU validation (remediation.domain.validation)
    RETURN = "return"
    QUARANTINE = "quarantine"
    DONE = "done"  # terminal marker


# Steps that act on the VM; they wait while the breaker is open or the gap/concurrency is used up.
VM_STEPS = frozenset({Step.VM_RESTART, Step.VERIFY})

HAPPY_PATH = (
    Step.SLURM_DRAIN,
    Step.K8S_CORDON,
    Step.K8S_EVICT,
    Step.VM_RESTART,
    Step.VERIFY,
    Step.VALIDATE,
    Step.RETURN,
    Step.DONE,
)

TRANSITIONS: dict[Step, frozenset[Step]] = {
    Step.SLURM_DRAIN: frozenset({Step.K8S_CORDON, Step.QUARANTINE}),
    Step.K8S_CORDON: frozenset({Step.K8S_EVICT, Step.QUARANTINE}),
    Step.K8S_EVICT: frozenset({Step.VM_RESTART, Step.QUARANTINE}),
    Step.VM_RESTART: frozenset({Step.VERIFY, Step.VM_RESTART, Step.QUARANTINE}),
    Step.VERIFY: frozenset({Step.VALIDATE, Step.RETURN, Step.VM_RESTART, Step.QUARANTINE}),
    Step.VALIDATE: frozenset({Step.RETURN, Step.VM_RESTART, Step.QUARANTINE}),
    Step.RETURN: frozenset({Step.DONE, Step.QUARANTINE}),
    Step.QUARANTINE: frozenset({Step.DONE}),
    Step.DONE: frozenset(),
}


class InvalidTransition(RuntimeError):
    pass


def check_transition(current: Step, nxt: Step) -> None:
    if nxt not in TRANSITIONS[current]:
        raise InvalidTransition(f"{current} -> {nxt} is not an allowed transition")


def next_on_success(step: Step, validation: bool = True) -> Step:
    """The step after ``step`` succeeds; without a validation (``validation.backend: none``) verify
    leads straight to return."""
    nxt = HAPPY_PATH[HAPPY_PATH.index(step) + 1]
    return HAPPY_PATH[HAPPY_PATH.index(nxt) + 1] if nxt is Step.VALIDATE and not validation else nxt
