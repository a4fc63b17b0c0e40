"""What a step reads again before it acts: whether a human took the node back, whether the fault that
opened the remediation still shows, and what a class with no machine action does instead.

Kept apart from the step bodies because the steps in their own modules (the evidence rule, the GPU
reset, the validation) ask the same questions: each imports these from here, and no module of the
domain has to import the step bodies back.
"""

from __future__ import annotations

from remediation.domain import slurm_states
from remediation.domain.causes import action_rungs, classify, first_action, table
from remediation.domain.events import Source
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
from remediation.domain.ownership import give_back, resume_if_ours
from remediation.domain.slurm_states import SlurmState
from remediation.domain.states import AuditAction
from remediation.ports.cluster import KubeNode, SlurmNode
from remediation.vocabulary import QUARANTINE


def human_took_back(inp: StepInput, ad: Adapters, cfg: StepSettings) -> Cancel | None:
    """Our cordon is gone: a human uncordoned the Node mid-remediation. We never re-cordon over them;
    we stop, and give back the one thing that is ours (our Slurm drain), as they evidently want the
    node in service."""
    if not inp.context.we_cordoned or not inp.context.k8s_node or ad.kube is None:
        return None
    knode = ad.kube.get(inp.context.k8s_node)
    if knode.unschedulable:
        return None
    ad.kube.uncordon(knode.name)  # nothing to lift: this drops our now-stale "cordoned by us" mark
    slurm_note = resume_if_ours(ad.slurm, inp.node, cfg.policy.our_reason_prefix)
    return Cancel(f"a human uncordoned {knode.name} during the remediation; stopped ({slurm_note})")


def trigger_present(inp: StepInput, ad: Adapters, knode: KubeNode | None, *, snode: SlurmNode,
                    cfg: StepSettings) -> str | None:
    """What still shows the fault that opened this remediation (None: it has cleared).

    Slurm: DOWN, FAIL or FAILING is the fault unless the reason is our own (our drain keeps a DOWN
    node DOWN after slurmd is back). Kubernetes: the condition that opened it must be reported again,
    and healthy; not reported yet is not proof. A manual report has nothing to re-check."""
    if snode.states & (slurm_states.FAILED | {SlurmState.DOWN}) and not snode.reason_is_ours(cfg.policy.our_reason_prefix):
        return f"Slurm reports {'+'.join(sorted(snode.states))} ({snode.reason or 'no reason'})"
    if inp.source == Source.KUBERNETES:
        cond_type, bad = inp.context.condition
        knode = knode or ad.node_now(inp.node, inp.context.k8s_node)
        if knode is None:  # nothing can show the condition healthy again
            return f"{cond_type} cannot be read: no Kubernetes at this site"
        now_status = knode.condition(cond_type)
        if now_status is None or now_status == bad:
            return f"{cond_type} is {now_status or 'not reported'} on {knode.name} (opened on {cond_type}={bad})"
    return None  # a manual report has no signal to re-check: the reboot and registration are the proof


def new_fault(inp: StepInput, knode: KubeNode | None, cfg: StepSettings) -> str | None:
    """A fault condition the Node reports now other than the one that opened this remediation (None:
    none). A fault that arrives while the node is under remediation is recorded as part of it and opens
    nothing, so the node must not be returned with it. Ready is verify's own test; an application-level
    XID is the workload's, not the node's (when the policy classifies faults).
    Why: docs/policy.md#proven-recovery"""
    if knode is None:
        return None
    own = inp.context.condition[0] if inp.source == Source.KUBERNETES else ""
    faults = cfg.policy.faults
    for wanted in cfg.policy.kube_conditions:
        cond_type, _, bad = wanted.partition("=")
        if cond_type in ("Ready", own) or knode.condition(cond_type) != bad:
            continue
        said = knode.messages.get(cond_type, "")
        if faults.classify and classify(Source.KUBERNETES, wanted, said, tbl=table(faults)).app_level:
            continue
        return f"{wanted} on {knode.name} ({said or 'no message'})"
    return None


def without_machine_action(inp: StepInput, ad: Adapters, cfg: StepSettings) -> Outcome | None:
    """A class whose ladder has no machine action: ``quarantine`` at once (hardware to return),
    or ``hold``: the node stays drained and cordoned, nothing is evicted or restarted, on-call is paged
    once, and the remediation holds until a human acts (cancel, release) or the fault clears by itself
    (then what is ours is given back). None: the class has machine actions (or a GPU reset); go on."""
    cls = inp.context.fault_class
    jobs = ad.site.validation
    if action_rungs(cls, cfg.policy.faults, cfg.workflow, gpu_reset=jobs):
        return None
    if cancel := human_took_back(inp, ad, cfg):
        return cancel
    if first_action(cls, cfg.policy.faults, cfg.workflow, gpu_reset=jobs) == QUARANTINE:
        # The engine adds the RMA note to every quarantine of a class with hardware to return.
        return Quarantine(f"class {cls} is quarantined at once: {inp.cause}")
    if (still := fault_still_there(inp, ad, cfg)) is None:
        given = give_back(ad, inp.node, cfg.policy.our_reason_prefix)
        return Cancel(f"the fault cleared while held (class {cls}, no machine action); gave back what was ours ({given})",
                      node_healthy=True)
    kept = "drained and cordoned" if ad.kube is not None else "drained (no Kubernetes)"
    why = f"held for a human: class {cls} takes no machine action; {kept}, on-call paged ({still}); cancel or release when fixed"
    note = Note(AuditAction.FAULT_HOLD, f"{inp.node}: {why}: {inp.cause}", {"fault_class": cls}) if inp.checks == 0 else None
    return wait(cfg.workflow, why, note=note)


def fault_still_there(inp: StepInput, ad: Adapters, cfg: StepSettings) -> str | None:
    """What still shows a held fault (None: cleared). Unlike :func:`trigger_present`, our own drain
    does not hide a DOWN node here: nothing was restarted, so DOWN is still the fault. Nor a FAIL:
    slurmctld drops a node's FAIL when we drain it, so while our drain stands, the FAIL it replaced
    is only over when a human says so (resumes the node, or drains it with a reason of their own)."""
    if inp.source == Source.MANUAL:
        return "reported by hand"
    snode = ad.slurm.get_node(inp.node)
    bad = snode.states & slurm_states.UNSERVING
    if inp.source == Source.SLURM:
        failed = slurm_states.named(inp.context.event_state or "") & slurm_states.FAILED
        ours = snode.reason_is_ours(cfg.policy.our_reason_prefix) and SlurmState.DRAIN in snode.flags
        if not bad and failed and ours:
            return f"Slurm {'+'.join(sorted(failed))}, which our drain replaced"
        return f"Slurm reports {'+'.join(sorted(bad))}" if bad else None
    return trigger_present(inp, ad, None, snode=snode, cfg=cfg)
