"""Nothing returns a node to service without evidence that it is healthy.

The evidence is a machine action proven by ``verify`` or a passed GPU check (``validate``).
:func:`unproven` is ``return``'s look at why it may have neither, and what it does instead of
resuming: a class whose ladder has no machine rung follows its own rule (hold or quarantine); a site
with no machine action and no GPU check follows ``workflow.unproven`` (``hold``, the default, or
``quarantine``). The service never resumes such a node itself.

Why: docs/policy.md#no-machine-action-only-evidence-returns-a-node-without-a-check-workflowunproven--hold
"""

from __future__ import annotations

from remediation.domain.causes import action_rungs
from remediation.domain.context import RemediationContext
from remediation.domain.outcomes import (
    Adapters,
    Cancel,
    Note,
    Outcome,
    Quarantine,
    StepInput,
    StepSettings,
    wait,
)
from remediation.domain.recheck import human_took_back, without_machine_action
from remediation.domain.slurm_states import SlurmState
from remediation.domain.statemachine import Site
from remediation.domain.states import AuditAction
from remediation.settings import WorkflowSettings
from remediation.vocabulary import MACHINE_ACTIONS, QUARANTINE


def lacks(site: Site) -> RemediationContext:
    """What the remediation records of the halves this site lacks (typed: on-call reads it, the
    steps never parse it)."""
    return RemediationContext(no_kubernetes=True if not site.kubernetes else None,
                              no_machine=True if not site.machine else None)


def action_here(action: str | None, site: Site, workflow: WorkflowSettings) -> str | None:
    """The ladder action a remediation records at this site. A machine rung the site cannot climb is
    not its action: while a GPU check decides it has none yet, and with no check it is what
    ``workflow.unproven`` does (hold, or quarantine)."""
    if site.machine or action not in MACHINE_ACTIONS:
        return action
    return None if site.validation else workflow.unproven


def unproven(inp: StepInput, ad: Adapters, cfg: StepSettings) -> Outcome | None:
    """What ``return`` does instead of resuming when nothing can have proven the node healthy; None:
    verify or the GPU check did, return goes on."""
    faults, wf = cfg.policy.faults, cfg.workflow
    if not action_rungs(inp.context.fault_class, faults, wf, gpu_reset=ad.site.validation):
        return without_machine_action(inp, ad, cfg)
    if ad.machine is not None or ad.validator is not None:
        return None
    if cancel := human_took_back(inp, ad, cfg):
        return cancel
    lacks = "no machine action and no GPU check at this site"
    if cfg.workflow.unproven == QUARANTINE:
        return Quarantine(f"{lacks}, so nothing can prove {inp.node} healthy (workflow.unproven: quarantine): "
                          f"{inp.cause}")
    node = ad.slurm.get_node(inp.node)
    if not node.reason_is_ours(cfg.policy.our_reason_prefix) or SlurmState.DRAIN not in node.flags:
        return Cancel(f"a human took {inp.node} back while it was held (Slurm: {'+'.join(sorted(node.states))}, "
                      f"reason {node.reason!r}); nothing of ours to give back")
    why = (f"held for a human: {lacks}, so nothing can prove {inp.node} healthy; it stays drained and "
           "on-call was paged; resume it in Slurm when it is fixed, or cancel with --give-back")
    note = Note(AuditAction.UNPROVEN_HOLD, f"{inp.node}: {why}: {inp.cause}", {"fault_class": inp.context.fault_class}) \
        if inp.checks == 0 else None
    return wait(cfg.workflow, why, note=note)
