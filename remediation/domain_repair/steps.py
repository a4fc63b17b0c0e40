"""The domain ladder's steps, each one look: drain every tray, wait for their jobs, restart the fabric
software on every tray, check the whole domain with one job, power-cycle the rack, quarantine or
return. A step that started something keeps what it started in its row's detail and finds it again.

Why: docs/policy.md#the-domain-ladder-one-repair-per-nvlink-domain
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from remediation.domain.checkpoint import CheckpointRequest, asks_checkpoint, send_unsent
from remediation.domain.events import Source
from remediation.domain.jobsafety import jobs_holding
from remediation.domain.outcomes import Adapters, StepSettings
from remediation.domain.ownership import Resumed, resume
from remediation.domain.slurm_states import SlurmState
from remediation.domain.step_bodies import human_hold
from remediation.domain_repair.rules import DomainStep, drain_reason, quarantine_reason
from remediation.hostlist import compress
from remediation.ports.errors import ConfigError, NotFound, UnknownNode
from remediation.ports.rack import RackReset
from remediation.settings import Settings
from remediation.validation.port import ValidationCheck, ValidationResult

_HELD = frozenset({SlurmState.DRAIN, SlurmState.FAIL})


@dataclass(frozen=True)
class Repair:
    """A snapshot of a claimed repair (the act phase never holds the row)."""

    id: int
    kind: str
    name: str
    trays: tuple[str, ...]
    fault_class: str
    ours: tuple[str, ...]
    rung: int
    rungs: tuple[str, ...]
    dry_run: bool
    key: str  # the step row's idempotency key: what it starts is named after it
    cause: str
    reporters: tuple[str, ...]
    detail: dict[str, Any] = field(default_factory=dict)  # the step row's: what this step started so far
    now: datetime = field(default_factory=lambda: datetime.now(UTC))  # when the look was claimed
    started_at: datetime = field(default_factory=lambda: datetime.now(UTC))  # when the step began
    source: Source = Source.SLURM  # who reported the signal that opened it

    @property
    def domain(self) -> str:
        return f"{self.kind} {self.name}"


@dataclass(frozen=True)
class Result:
    """One look's outcome: ``done`` (with ``ok``: it did what it was for) or not yet (look again after
    ``wait_s``). ``detail`` replaces the row's; ``ours`` the trays whose drain is ours; ``page`` what a
    quarantine's page names (the RMA note)."""

    done: bool
    ok: bool = True
    detail: dict[str, Any] = field(default_factory=dict)
    outcome: str = ""
    wait_s: float | None = None
    ours: tuple[str, ...] | None = None
    page: dict[str, Any] | None = None


Body = Callable[[Repair, Adapters, Settings], Result]


def has_chassis(ad: Adapters, domain: str) -> bool:
    """The rack's chassis is in the inventory (``redfish.chassis``): the power cycle is a rung."""
    return ad.rack is not None and ad.rack.knows(domain)


# ------------------------------------------------------------------------------------- the steps


def drain(rep: Repair, ad: Adapters, cfg: Settings) -> Result:
    """Drain every tray with our reason and cordon its Node. A tray whose signal is the domain's fault
    is taken over as the node ladder takes over its node; any other tray a human drained is left theirs
    (never resumed by us), and so is a maintenance drain (``policy.ignore_reasons``)."""
    detail = rep.detail
    prefix = cfg.policy.our_reason_prefix
    if not _still_bad(rep, ad):
        return Result(True, ok=False, detail=detail, outcome=(
            f"Slurm shows none of {compress(list(rep.reporters))} drained, down or failed now: the signal is "
            "not confirmed, nothing was done"))
    reason = drain_reason(prefix, rep.id, kind=rep.kind, name=rep.name)
    ours, theirs, unknown = [], [], []
    for tray in rep.trays:
        try:
            node = ad.slurm.get_node(tray)
        except UnknownNode:  # in the domain's last topology, no longer in Slurm: nothing to drain
            unknown.append(tray)
            continue
        held = bool(node.flags & _HELD) or node.state == SlurmState.DOWN
        if human_hold(node, StepSettings.of(cfg)) or (held and not node.reason_is_ours(prefix)
                                                      and tray not in rep.reporters):
            theirs.append(tray)
            continue
        if node.reason != reason or SlurmState.DRAIN not in node.flags:
            ad.slurm.drain(tray, reason)
        ours.append(tray)
        _cordon(ad, tray, reason)
    said = f"drained {compress(ours)}" if ours else "no tray to drain"
    if theirs:
        said += f"; left {compress(theirs)} as someone else drained them"
    if unknown:
        said += f"; {compress(unknown)} unknown to Slurm"
    return Result(True, detail={**detail, "ours": ours, "theirs": theirs, "unknown": unknown}, outcome=said,
                  ours=tuple(ours))


def _still_bad(rep: Repair, ad: Adapters) -> bool:
    """The signal confirmed against its authority before anything is done: a Slurm signal needs Slurm
    to show a reporting tray drained, down or failed now (a stale or forged event drains no rack).
    A Kubernetes condition was held for its hold time by the watcher; it is taken as reported."""
    if rep.source is not Source.SLURM:
        return True
    for tray in rep.reporters:
        node = ad.slurm.get_node(tray)
        if node.flags & _HELD or node.state == SlurmState.DOWN:
            return True
    return False


def _cordon(ad: Adapters, tray: str, reason: str) -> None:
    if ad.kube is None:
        return
    try:
        ad.kube.cordon(ad.kube.node_for(tray), reason[:250])
    except (UnknownNode, NotFound):
        pass  # a tray with no Node (bare metal beside a Kubernetes site): Slurm's drain holds it


def jobs(rep: Repair, ad: Adapters, cfg: Settings) -> Result:
    """Wait until no job holds any tray, asking them to checkpoint first where the node ladder would
    (``workflow.checkpoint_signal``, once, claimed on the step row before scancel runs). A domain action
    never runs under a job: past ``workflow.drain_timeout_s`` it keeps waiting and says so."""
    detail = rep.detail
    busy: dict[str, str] = {}
    held: list[str] = []
    for tray in rep.trays:
        try:
            ids, why = jobs_holding(ad, ad.slurm.get_node(tray))
        except UnknownNode:
            continue  # no longer in Slurm: no job of Slurm's runs there
        if why is not None:
            busy[tray] = why
            held += ids
    if not busy:
        return Result(True, detail=detail, outcome="no job on any tray")
    said = f"waiting for the jobs on {compress(sorted(busy))}"
    if held and asks_checkpoint(rep.fault_class, cfg.workflow):
        asked = _checkpoint(rep, ad, cfg, held=sorted(set(held)))
        said += f"; asked {len(asked.signalled)} job(s) to checkpoint ({asked.signal})"
    if (rep.now - rep.started_at).total_seconds() > cfg.workflow.drain_timeout_s:
        said += (f"; past workflow.drain_timeout_s ({cfg.workflow.drain_timeout_s:g} s): still waiting, a domain "
                 "action never runs under a job (a human may requeue them)")
    return Result(False, detail={**detail, "busy": busy}, outcome=said)


def _checkpoint(rep: Repair, ad: Adapters, cfg: Settings, *, held: list[str]) -> CheckpointRequest:
    """The trays' jobs asked to checkpoint once: the request is claimed on the step row first, and a
    later look sends only what no look claimed (never a job twice)."""
    if ad.intents is None:
        raise ConfigError("a checkpoint request is sent only where its intent can be recorded first (the "
                          "process built its adapters without the database's intents)", component="slurm")
    wf = cfg.workflow
    request = CheckpointRequest(tuple(held), wf.checkpoint_signal or "", wf.checkpoint_scope, rep.now,
                                wf.checkpoint_wait_s)
    first = ad.intents.claim(rep.key, request.dump())
    if first is not None:
        request = CheckpointRequest.load(first) or request
    return send_unsent(rep.key, ad, request) if request.unsent else request


def fabric_restart(rep: Repair, ad: Adapters, cfg: Settings) -> Result:
    """Restart the fabric software (IMEX, the fabric manager) on every tray: one job per tray through
    the validation backend, all at once. Ok when every job exits 0."""
    detail = rep.detail
    val = cfg.validation
    if not rep.ours:
        return _nobody(rep)
    checks = [ValidationCheck(node=tray, name=_name(rep, "fab", i), command=tuple(val.fabric_restart),
                              timeout_s=val.fabric_restart_timeout_s, cause_class=rep.fault_class,
                              purpose="restart fabric", nonce=str(detail["nonce"]))
              for i, tray in enumerate(rep.ours)]
    return _run(checks, detail, ad, what="fabric restart")


def domain_check(rep: Repair, ad: Adapters, cfg: Settings) -> Result:
    """One check job over every tray of the domain we drained (``validation.domain_checks``): the proof
    that the trays can still talk to each other over NVLink. Ok on exit 0. A tray someone else holds
    (a maintenance drain) is left out of every job, as it is left out of the drain."""
    detail = rep.detail
    val = cfg.validation
    if not rep.ours:
        return _nobody(rep)
    check = ValidationCheck(node=rep.ours[0], nodes=rep.ours, name=_name(rep, "dom", 0),
                            command=tuple(val.domain_check_for(rep.fault_class)),
                            timeout_s=val.domain_check_timeout_s, cause_class=rep.fault_class,
                            purpose="domain check", nonce=str(detail["nonce"]))
    return _run([check], detail, ad, what="domain check")


def _nobody(rep: Repair) -> Result:
    return Result(True, ok=False, detail=rep.detail, outcome=(
        f"every tray of {rep.domain} is held by someone else: no job runs on a tray we did not drain"))


def chassis_reset(rep: Repair, ad: Adapters, cfg: Settings) -> Result:
    """Power-cycle the rack through its chassis (``redfish.chassis``), once: the reset is claimed on
    the step row before it is sent; then look until the BMC shows the cycle done (Off seen, then On)."""
    detail = rep.detail
    if ad.rack is None or not ad.rack.knows(rep.name):
        return Result(True, ok=False, detail=detail, outcome=f"no chassis for {rep.domain} in redfish.chassis")
    if "reset" not in detail:
        sent = ad.rack.reset(rep.name, rep.key)
        return Result(False, detail={**detail, "reset": sent.to_dict()}, wait_s=0.0,
                      outcome=f"power cycle of chassis {sent.chassis} sent ({sent.via})")
    seen = ad.rack.poll(RackReset.from_dict(detail["reset"]))
    detail = {**detail, "reset": seen.to_dict()}
    if not seen.done:
        return Result(False, detail=detail, outcome=seen.detail or "waiting for the rack's power cycle")
    if seen.recorded_only:
        return Result(True, detail=detail, outcome=f"would power-cycle chassis {seen.chassis}")
    ok = seen.evidence is not None and seen.error is None
    return Result(True, ok=ok, detail=detail, outcome=(seen.evidence if ok else seen.error) or "no proof of the cycle")


def quarantine(rep: Repair, ad: Adapters, cfg: Settings) -> Result:
    """Hold the whole domain for a human and an RMA: every tray we drained keeps a quarantine reason;
    one page names the domain, its trays and what was tried."""
    detail = rep.detail
    prefix = cfg.policy.our_reason_prefix
    reason = quarantine_reason(prefix, rep.id, kind=rep.kind, name=rep.name, cause=rep.fault_class)
    for tray in rep.ours:
        ad.slurm.drain(tray, reason)
    tried = ", ".join(rep.rungs[: rep.rung]) or "nothing could prove the domain here"
    note = (f"RMA: NVLink domain {rep.domain}, trays {compress(list(rep.trays))}; {rep.fault_class} "
            f"({rep.cause}); tried: {tried}")
    return Result(True, detail=detail, outcome=f"quarantined {rep.domain}: {note}",
                  page={"rma": note, "tried": list(rep.rungs[: rep.rung])})


def give_back(rep: Repair, ad: Adapters, cfg: Settings) -> Result:
    """Return every tray whose drain is ours (while its reason is still ours) and uncordon it; a drain
    someone placed meanwhile is left theirs."""
    detail = rep.detail
    prefix = cfg.policy.our_reason_prefix
    said, back, left = [], 0, []
    for tray in rep.ours:
        done, words = resume(ad.slurm, tray, prefix)
        said.append(f"{tray}: {words}")
        back += done is Resumed.RESUMED
        if done is Resumed.NOT_OURS:
            left.append(f"{tray}: {words}")
        if ad.kube is not None:
            try:
                ad.kube.uncordon(ad.kube.node_for(tray))
            except (UnknownNode, NotFound):
                pass
    outcome = f"the domain check passed: {back} trays returned"
    return Result(True, detail={**detail, "returned": said},
                  outcome=outcome + (f"; {'; '.join(left)}" if left else ""))


# ---------------------------------------------------------------------------------- the jobs


def _name(rep: Repair, what: str, index: int) -> str:
    return f"nr-{what}-d{rep.id}-{rep.key.rsplit('-', 1)[-1]}-{index}-{rep.detail['nonce']}"


def _run(checks: list[ValidationCheck], detail: dict[str, Any], ad: Adapters, *, what: str) -> Result:
    """Start each check not yet started (its reference is kept before anyone waits on it), look at each
    running one, and when all are done finish them (the trays drained again): ok when all passed."""
    val = ad.validator
    if val is None:
        return Result(True, ok=False, detail=detail, outcome=f"no validation backend: no {what} can run")
    refs: dict[str, Any] = dict(detail.get("refs", {}))
    ended: dict[str, Any] = dict(detail.get("ended", {}))
    for check in checks:
        if check.name not in refs:
            refs[check.name] = {**val.start(check), "name": check.name, "node": check.node,
                                "nodes": list(check.nodes) or [check.node], "purpose": check.purpose}
            return Result(False, detail={**detail, "refs": refs, "ended": ended}, wait_s=0.0,
                          outcome=f"{what} started on {check.node}")
    for check in checks:
        if check.name in ended:
            continue
        seen = val.poll(refs[check.name])
        if seen.done:
            ended[check.name] = _verdict(seen)
    if len(ended) < len(checks):
        return Result(False, detail={**detail, "refs": refs, "ended": ended},
                      outcome=f"{what}: {len(ended)}/{len(checks)} done")
    for check in checks:
        val.finish(refs[check.name])
    failed = {n: v for n, v in ended.items() if not v["passed"]}
    said = f"{what} passed ({len(checks)} jobs)" if not failed else (
        f"{what} failed: " + "; ".join(f"{n} {v['state']} exit {v['exit_code']}" for n, v in sorted(failed.items())))
    return Result(True, ok=not failed, detail={**detail, "refs": refs, "ended": ended}, outcome=said)


def take_down(detail: dict[str, Any], ad: Adapters) -> str:
    """Finish every job a step started (a cancelled repair's): each reservation gone, each tray back as
    it was before the job."""
    refs = detail.get("refs", {})
    if not refs or ad.validator is None:
        return "nothing running"
    return "; ".join(ad.validator.finish(ref) for ref in refs.values())


def _verdict(seen: ValidationResult) -> dict[str, Any]:
    return {"passed": seen.passed, "exit_code": seen.exit_code, "state": seen.state,
            "timed_out": seen.timed_out, "output": seen.output[-512:]}


STEPS: dict[DomainStep, Body] = {
    DomainStep.DRAIN: drain,
    DomainStep.JOBS: jobs,
    DomainStep.FABRIC_RESTART: fabric_restart,
    DomainStep.DOMAIN_CHECK: domain_check,
    DomainStep.CHASSIS_RESET: chassis_reset,
    DomainStep.QUARANTINE: quarantine,
    DomainStep.RETURN: give_back,
}
