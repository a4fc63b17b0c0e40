"""The body of each workflow step: one look at the world, at most one action, and a verdict.

Each function gets a frozen snapshot of its remediation (``StepInput``) and the adapters, calls outside
at most once or twice, and returns ``Done``, ``Wait``, ``Escalate`` or ``Quarantine``. The engine
persists the outcome; these functions never touch the database. Ownership rules
(:mod:`remediation.domain.ownership`) apply to every step.

Why: docs/architecture.md#a-step-runs-in-three-phases
"""

from __future__ import annotations

from datetime import UTC, datetime

from remediation.domain import slurm_states
from remediation.domain.causes import action_rungs
from remediation.domain.checkpoint import ask_pods
from remediation.domain.context import RemediationContext
from remediation.domain.events import Source
from remediation.domain.evidence import unproven
from remediation.domain.gpu_reset import gpu_reset, verify_reset
from remediation.domain.hardware import identity_now, machine_ref, read_identity
from remediation.domain.jobsafety import jobs_holding, no_jobs_left, wait_for_jobs
from remediation.domain.machine_actions import provider_action
from remediation.domain.outcomes import Adapters as Adapters
from remediation.domain.outcomes import Cancel as Cancel
from remediation.domain.outcomes import Done as Done
from remediation.domain.outcomes import Escalate as Escalate
from remediation.domain.outcomes import Note as Note
from remediation.domain.outcomes import Outcome as Outcome
from remediation.domain.outcomes import Quarantine as Quarantine
from remediation.domain.outcomes import StepFn as StepFn
from remediation.domain.outcomes import StepInput as StepInput
from remediation.domain.outcomes import StepSettings as StepSettings
from remediation.domain.outcomes import Wait as Wait
from remediation.domain.outcomes import elapsed, wait
from remediation.domain.ownership import give_back, resume_if_ours
from remediation.domain.policy import ignored_reason
from remediation.domain.providerid import parse_provider_id
from remediation.domain.recheck import human_took_back, new_fault, trigger_present, without_machine_action
from remediation.domain.slurm_states import SlurmState
from remediation.domain.statemachine import Step
from remediation.domain.step_records import (
    EvictDetail,
    MachineDetail,
    QuarantineDetail,
    ReturnDetail,
    VerifyDetail,
)
from remediation.evidence_collection.step import collect_evidence
from remediation.ports.cluster import (
    Operation,
    SlurmNode,
    VMAction,
)
from remediation.ports.errors import ConfigError, NotFound, UnknownNode
from remediation.validation.rules import validate
from remediation.vocabulary import GPU_RESET


def slurm_reason(text: str) -> str:
    """One printable line of at most 1,000 characters: slurmctld's reason is a single line, and the
    adapters refuse control characters. Causes and provider messages (Azure's span three lines) are
    not, and a refused reason would fail the drain or the quarantine itself."""
    return " ".join("".join(c if c.isprintable() else " " for c in text).split())[:1000]


def human_hold(node: SlurmNode, cfg: StepSettings) -> bool:
    """A human's drain whose reason matches the ignore list (maintenance): it already keeps the node
    out of the pool, and taking it over would let ``return`` resume a node under maintenance."""
    return (
        SlurmState.DRAIN in node.flags
        and not node.reason_is_ours(cfg.policy.our_reason_prefix)
        and ignored_reason(node.reason, cfg.policy) is not None
    )


def still_bad(inp: StepInput, ad: Adapters, node: SlurmNode, *, cfg: StepSettings,
              now: datetime) -> Cancel | None:
    """Confirm the event against its authority before the first action: an event on the stream is its
    publisher's claim (stale after an outage, replayed, or forged), so Slurm must show the node bad now,
    or the apiserver the Node's condition. Nothing is done to a node its authority shows healthy. Our
    own drain counts as bad, so a step re-run after we drained is never mistaken for a recovery.
    docs/architecture.md, "Believe nothing unchecked"."""
    if inp.checks > 0 or inp.source not in (Source.SLURM, Source.KUBERNETES):
        return None
    observed = inp.context.observed
    old = observed is not None and (now - observed).total_seconds() >= cfg.workflow.stale_event_s
    word = "stale" if old else "unconfirmed"
    if inp.source == Source.SLURM:
        if node.states & slurm_states.BAD:
            return None
        return Cancel(f"{word}: Slurm reports {inp.node} {'+'.join(sorted(node.states))} now; nothing done",
                      node_healthy=True)
    cond_type, _ = inp.context.condition
    knode = ad.node_now(inp.node, inp.context.k8s_node)  # None: no Node to read; Slurm's drain decides
    now_status = knode.condition(cond_type) if knode is not None else None
    if knode is None or f"{cond_type}={now_status}" in cfg.policy.kube_conditions or node.states & slurm_states.BAD:
        return None
    return Cancel(f"{word}: {cond_type} is {now_status or 'not reported'} on {knode.name} now; nothing done",
                  node_healthy=True)


def slurm_drain(inp: StepInput, ad: Adapters, cfg: StepSettings, *, now: datetime) -> Outcome:
    prefix = cfg.policy.our_reason_prefix
    node = ad.slurm.get_node(inp.node)
    if stale := still_bad(inp, ad, node, cfg=cfg, now=now):
        return stale
    if not human_hold(node, cfg) and (not node.reason_is_ours(prefix) or SlurmState.DRAIN not in node.flags):
        ad.slurm.drain(inp.node, slurm_reason(f"{prefix} {inp.cause}"))
        node = ad.slurm.get_node(inp.node)  # ALLOCATED+DRAIN now reads DRAINING: decide on that
    jobs, busy = jobs_holding(ad, node)
    if busy is None:
        if node.states & {SlurmState.DOWN, SlurmState.FAIL}:
            return Done(f"drained; node is {'+'.join(sorted(node.states))}, no jobs to wait for")
        return Done("drained; no jobs running")
    return wait_for_jobs(inp, ad, cfg.workflow, jobs=jobs, busy=busy, now=now)


def k8s_cordon(inp: StepInput, ad: Adapters, cfg: StepSettings, *, now: datetime) -> Outcome:
    kube = ad.kubernetes(Step.K8S_CORDON)
    k8s_name = inp.context.k8s_node or kube.node_for(inp.node)
    knode = kube.cordon(k8s_name, f"{cfg.policy.our_reason_prefix} {inp.cause}"[:250])
    ours = knode.cordoned_by_us  # False when a human had cordoned it first
    return Done(
        f"cordoned {k8s_name}" if ours else f"{k8s_name} was already cordoned by someone else; left theirs",
        context=RemediationContext(k8s_node=k8s_name, boot_id_before=knode.boot_id,
                                   provider_id=knode.provider_id, we_cordoned=ours),
    )


def healthy_again(inp: StepInput, ad: Adapters, cfg: StepSettings) -> Cancel | None:
    """After the storm breaker closes, every held remediation re-confirms its trigger against the
    live state before its next disruptive action (``context.reconfirm``, set by the close). A node
    that is healthy again (a human resumed it in Slurm, its condition cleared) is cancelled and what
    is ours (drain, cordon, taint) is given back; a node still bad goes on."""
    if not inp.context.reconfirm or inp.source == Source.MANUAL:
        return None
    snode = ad.slurm.get_node(inp.node)
    if inp.source == Source.SLURM:
        bad = snode.states & slurm_states.BAD
        if inp.context.incident_closed and snode.reason_is_ours(cfg.policy.our_reason_prefix):
            # A member of a closed incident kept our drain (and DOWN, which our reason replaced
            # "Not responding" on): what counts is whether it answers again.
            bad -= slurm_states.DRAINED | ({SlurmState.DOWN} if SlurmState.NOT_RESPONDING not in snode.flags else set())
        if bad:
            return None
        why = f"Slurm reports {'+'.join(sorted(snode.states))}"
    else:
        cond_type, bad_status = inp.context.condition
        knode = ad.node_now(inp.node, inp.context.k8s_node)
        now_status = knode.condition(cond_type) if knode else None
        if knode is None or now_status is None or now_status == bad_status:
            return None
        why = f"{cond_type} is {now_status} on {knode.name}"
    given = give_back(ad, inp.node, cfg.policy.our_reason_prefix)
    after = (f"incident #{inp.context.incident_closed} closed" if inp.context.incident_closed
             else "the storm breaker closed")
    return Cancel(f"re-confirmed after {after}: healthy again ({why}); cancelled, gave back "
                  f"what was ours ({given})", node_healthy=True)


def before_disruption(inp: StepInput, ad: Adapters, cfg: StepSettings, *, what: str,
                      record: type[EvictDetail | MachineDetail]) -> Outcome | None:
    """The checks before an eviction or a machine action, in order: a human took the node back, it is
    healthy again (after the breaker closed), or jobs still run on it (on the step's ``record``).
    None: go ahead."""
    return (human_took_back(inp, ad, cfg) or healthy_again(inp, ad, cfg)
            or no_jobs_left(inp, ad, cfg.workflow, what=what, record=record))


def k8s_evict(inp: StepInput, ad: Adapters, cfg: StepSettings, *, now: datetime) -> Outcome:
    if stop := without_machine_action(inp, ad, cfg):
        return stop
    if stop := before_disruption(inp, ad, cfg, what="eviction", record=EvictDetail):
        return stop
    kube = ad.kubernetes(Step.K8S_EVICT)
    k8s_name = inp.context.k8s_node or kube.node_for(inp.node)
    if asked := ask_pods(inp, ad, cfg.workflow, k8s_node=k8s_name, now=now):
        return asked
    progress = kube.evict_pods(k8s_name)
    if progress.done:
        return Done("all pods evicted", context=RemediationContext(reconfirm=False if inp.context.reconfirm else None))
    if elapsed(inp, now) > cfg.workflow.evict_timeout_s:
        blocked = ", ".join(progress.blocked) or f"{progress.remaining} pod(s)"
        return Quarantine(f"eviction still blocked after {cfg.workflow.evict_timeout_s}s ({blocked}); not forcing")
    return wait(
        cfg.workflow, f"{progress.remaining} pod(s) left, {len(progress.blocked)} blocked by a disruption budget",
        progress.retry_after, detail=EvictDetail(remaining=progress.remaining, blocked=tuple(progress.blocked)),
    )


def rung(inp: StepInput, ad: Adapters, cfg: StepSettings) -> str:
    """The action of the remediation's rung (class unknown: workflow.ladder; gpu-reset only where jobs run)."""
    rungs = action_rungs(inp.context.fault_class, cfg.policy.faults, cfg.workflow,
                         gpu_reset=ad.site.validation) or tuple(cfg.workflow.ladder)
    return rungs[min(inp.ladder, len(rungs) - 1)]


def machine_action(inp: StepInput, ad: Adapters, cfg: StepSettings, *,
                   provider: str | None = None) -> VMAction:
    """The machine action of the remediation's ladder rung, as ``provider`` carries it out."""
    return provider_action(rung(inp, ad, cfg), provider)


def slurmctld_time(op: Operation) -> str:
    """When slurmctld took ``op``, on slurmctld's own clock (ISO), where the provider knows it (Slurm's
    reboot: the ReasonTime of its request); "" where it does not (a cloud's or a BMC's action)."""
    at = op.data.get("slurmctld_at")
    return datetime.fromtimestamp(at, UTC).isoformat() if isinstance(at, int) and not isinstance(at, bool) else ""


def slurmd_start(ad: Adapters, node: str) -> MachineDetail:
    """slurmd's last start as slurmctld has it, recorded before a machine action: a later start is the
    proof of a boot on slurmctld's clock alone, like a boot counter. docs/architecture.md, "Believe
    nothing unchecked"."""
    return MachineDetail(slurmd_read=True, slurmd_start_before=ad.slurm.get_node(node).slurmd_start_time)


def slurmd_before(recorded: MachineDetail) -> str | None:
    """slurmd's start before the action as the context keeps it: ISO, "" where it was read and
    unknown, None where it was never read."""
    if not recorded.slurmd_read:
        return None
    return recorded.slurmd_start_before.isoformat() if recorded.slurmd_start_before else ""


def vm_restart(inp: StepInput, ad: Adapters, cfg: StepSettings, *, now: datetime) -> Outcome:
    reset = rung(inp, ad, cfg) == GPU_RESET
    if inp.provider_op is None and (stop := before_disruption(
            inp, ad, cfg, what="GPU reset" if reset else "machine action", record=MachineDetail)):
        return stop
    if reset:
        return gpu_reset(inp, ad, cfg, now=now)
    machine = ad.machine
    if machine is None:  # the site's path has no machine step; a remediation that reached one anyway
        raise ConfigError("vm_restart ran without a machine backend (machine.backend none)", component="machine")
    recorded = MachineDetail.load(inp.detail)
    if inp.provider_op is None and not recorded.slurmd_read:
        # Recorded before the action, in a write of its own: a worker killed inside the provider's call
        # then resumes with the start from before it, never one the action itself caused.
        return Wait("read slurmd's start before the machine action", 0.0, detail=slurmd_start(ad, inp.node))
    if inp.provider_op is None:
        # Bare metal has no providerID: a backend that names the machine by the node does.
        vm = machine_ref(inp, ad) or parse_provider_id(inp.context.provider_id or "")
        before = read_identity(ad, vm)  # the hardware the fault happened on
        op = machine.start(vm, machine_action(inp, ad, cfg, provider=vm.provider), inp.key)
        issued = "recorded, not issued" if op.recorded_only else "issued"
        return wait(cfg.workflow, f"{op.action} {issued} ({op.ref})", provider_op=op.to_dict(),
                    detail=MachineDetail(identity=before))
    op = Operation.from_dict(inp.provider_op)
    status = machine.poll(op)
    if status.error:
        return Escalate(f"{op.action} failed at the provider: {status.error}")
    if status.done:
        # The attempt's start is written before the provider is called: any slurmd start or boot
        # after it is proof the action happened (verify).
        ended = "recorded, not issued" if op.recorded_only else "completed"
        after = (MachineDetail(identity=read_identity(ad, op.vm), after_action=op.action)
                 if not op.recorded_only else None)
        return Done(f"{op.action} {ended} ({op.ref})", context=RemediationContext(
            machine_action_at=inp.started_at.isoformat(), machine_op_ref=op.ref,
            machine_op_recorded=op.recorded_only, reconfirm=False,
            slurmctld_action_at=slurmctld_time(op), slurmd_start_before=slurmd_before(recorded)), detail=after)
    if elapsed(inp, now) > cfg.workflow.vm_operation_timeout_s and not status.midway:
        return Escalate(f"{op.action} not done after {cfg.workflow.vm_operation_timeout_s}s")
    current = status.replace or op
    return wait(cfg.workflow, f"waiting on {current.action} ({current.ref})", provider_op=current.to_dict())


def verify(inp: StepInput, ad: Adapters, cfg: StepSettings, *, now: datetime) -> Outcome:
    """Recovery is proven, not inferred: a new bootID (without a Kubernetes bootID: a slurmd start
    later than the machine action), slurmd registered after the action as its start time shows (compared with
    slurmctld's own time of the action where the action has one; a missing NOT_RESPONDING flag is not
    enough: a pre-reboot state satisfies it), the trigger cleared, and no new fault reported (see
    :func:`new_fault`). A node whose trigger or new fault is still there climbs the ladder at the
    timeout; it never returns."""
    if cancel := human_took_back(inp, ad, cfg):
        return cancel
    if inp.context.machine_op_recorded_only:
        return Done("nothing was restarted (dry-run), so recovery is not checked")
    if rung(inp, ad, cfg) == GPU_RESET:
        return verify_reset(inp, ad, cfg, now=now)
    knode = ad.node_now(inp.node, inp.context.k8s_node)  # None: no Kubernetes; slurmd's start is the proof
    snode = ad.slurm.get_node(inp.node)
    action_at, ctld = inp.context.machine_action_at, inp.context.slurmctld_action_at
    # One clock: slurmctld's own time of the action where the machine action has one (Slurm's reboot),
    # else the attempt's start. Slurm stamps in whole seconds: a start in the action's second counts.
    stamp = ctld or action_at
    since = datetime.fromisoformat(stamp) if stamp else inp.started_at
    started, than = snode.slurmd_start_time, f"the action at {since:%Y-%m-%d %H:%M:%S}"
    slurmd_after = started is not None and started.timestamp() >= int(since.timestamp())
    if (last := inp.context.slurmd_start_before) is not None:  # slurmctld's clock alone: a new start
        newer = started is not None and (not last or started > datetime.fromisoformat(last))
        slurmd_after = newer or (bool(ctld) and slurmd_after)  # or after slurmctld's own time of it
        than = f"its start before the action ({last or 'none'})"
    before = inp.context.boot_id_before
    rebooted = knode.boot_id != before if knode and before else slurmd_after
    responding = SlurmState.NOT_RESPONDING not in snode.flags
    trigger = trigger_present(inp, ad, knode, snode=snode, cfg=cfg)
    fresh = new_fault(inp, knode, cfg)
    ready = knode is None or knode.ready == "True" or not before
    seen = f"Ready={knode.ready}, new bootID={rebooted}" if knode else "no Kubernetes Node"
    facts = (f"{seen}, slurmd started after the action={slurmd_after} ({started:%Y-%m-%d %H:%M:%S} vs "
             f"{than})" if started else f"{seen}, slurmd start time unknown")
    if ready and rebooted and slurmd_after and responding and trigger is None and fresh is None:
        boot = f"Ready with new bootID {knode.boot_id}" if knode else "no Kubernetes Node"
        return Done(f"{boot}; slurmd registered at {started:%Y-%m-%d %H:%M:%S}, after {than}; trigger cleared",
                    detail=VerifyDetail(knode.boot_id) if knode else None)
    still = (f"; trigger still present: {trigger}" if trigger else "") + (f"; a new fault: {fresh}" if fresh else "")
    if elapsed(inp, now) > cfg.workflow.verify_timeout_s:
        acted = machine_action(inp, ad, cfg)
        return Escalate(f"not recovered {cfg.workflow.verify_timeout_s}s after {acted}: {facts}"
                        f"{', slurmd not responding' if not responding else ''}{still}")
    return wait(cfg.workflow, f"waiting for proof of recovery: {facts}{still}")


def return_to_service(inp: StepInput, ad: Adapters, cfg: StepSettings, *, now: datetime) -> Outcome:
    if stop := unproven(inp, ad, cfg):
        return stop
    if inp.context.domain_repair is not None:  # validation.domain_check_on_return: the domain check decides
        return Done(f"handed to domain repair #{inp.context.domain_repair}: the tray stays drained until the "
                    "domain check over its NVLink domain passes")
    notes = []
    k8s_name = inp.context.k8s_node
    if k8s_name and ad.kube is not None:
        ad.kube.set_quarantine_taint(k8s_name, False)
        notes.append("uncordoned" if ad.kube.uncordon(k8s_name) else "cordon not ours, left as is")
    notes.append(resume_if_ours(ad.slurm, inp.node, cfg.policy.our_reason_prefix))
    if inp.context.repair_request is not None:  # a re-check after a repair: which hardware comes back
        return Done("; ".join(notes), detail=ReturnDetail(identity_now(inp, ad)))
    return Done("; ".join(notes))


def quarantine(inp: StepInput, ad: Adapters, cfg: StepSettings, *, now: datetime) -> Outcome:
    prefix = cfg.policy.our_reason_prefix
    why = inp.context.quarantine_reason or inp.cause
    node = ad.slurm.get_node(inp.node)
    reason = slurm_reason(f"{prefix} quarantined: {why}")
    if node.reason != reason and not human_hold(node, cfg):
        ad.slurm.drain(inp.node, reason)
    notes = ["kept out of the Slurm pool", taint(ad, inp.node, inp.context.k8s_node)]
    held = identity_now(inp, ad)  # the hardware kept out
    return Done("; ".join(notes), context=RemediationContext(quarantine_reason=why), detail=QuarantineDetail(held))


def taint(ad: Adapters, node: str, k8s_node: str | None) -> str:
    """Put our quarantine taint on the node's Kubernetes Node, and say what was done."""
    if ad.kube is None:
        return "no Kubernetes: no Node to taint"
    try:
        k8s_name = k8s_node or ad.kube.node_for(node)
        ad.kube.set_quarantine_taint(k8s_name, True)
        return f"tainted {k8s_name}"
    except (UnknownNode, NotFound) as exc:
        return f"no Kubernetes Node to taint ({exc.message})"


def _validate(inp: StepInput, ad: Adapters, cfg: StepSettings, *, now: datetime) -> Outcome:
    return validate(inp, ad, cfg, now=now)


def _collect_evidence(inp: StepInput, ad: Adapters, cfg: StepSettings, *, now: datetime) -> Outcome:
    """Before a quarantine (the engine set its reason) or before the rung's machine action."""
    quarantine = inp.context.quarantine_reason is not None
    return collect_evidence(inp, ad, cfg, now=now, action=None if quarantine else rung(inp, ad, cfg))


STEPS: dict[Step, StepFn] = {
    Step.SLURM_DRAIN: slurm_drain,
    Step.K8S_CORDON: k8s_cordon,
    Step.K8S_EVICT: k8s_evict,
    Step.COLLECT_EVIDENCE: _collect_evidence,
    Step.VM_RESTART: vm_restart,
    Step.VERIFY: verify,
    Step.VALIDATE: _validate,
    Step.RETURN: return_to_service,
    Step.QUARANTINE: quarantine,
}
