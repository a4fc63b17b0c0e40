"""The ``collect_evidence`` step: the node's state kept before the hammer, as one job through the
validator, before the first machine action and before a quarantine. It never climbs the ladder: where
no job can run it records "no evidence: why" and the ladder goes on; at ``evidence.max_wait_s`` the
job is stopped and what it wrote is kept. Its name comes from the step's key and nonce, so a killed
worker never collects twice.

Why: docs/policy.md#collected-evidence-the-nodes-state-before-the-hammer
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from remediation.domain.context import RemediationContext
from remediation.domain.outcomes import Adapters, Done, Outcome, StepInput, StepSettings, Wait, elapsed
from remediation.domain.recheck import human_took_back
from remediation.domain.slurm_states import SlurmState
from remediation.domain.step_records import EvidenceDetail
from remediation.domain.stepdetail import JobNonce
from remediation.evidence_collection.rules import (
    PURPOSE,
    JournalLine,
    Occasion,
    Plan,
    job_command,
    parse,
    plan,
    summary,
)
from remediation.validation.port import ValidationCheck, ValidationResult, Validator
from remediation.validation.rules import cause_class, humans_drain, job_name, look, start_job, still_running

#: How far before the fault's observation the kernel log is read from, seconds: the XID precedes it.
LOOKBACK_S = 600


def occasion(inp: StepInput, *, action: str | None, quarantine: bool) -> Occasion:
    return Occasion(inp.context.fault_class, action, inp.remediation_id, inp.cause, quarantine=quarantine)


def evidence_name(key: str, nonce: str = "") -> str:
    """``r12:collect_evidence:1`` -> ``nr-evidence-r12-a1-NONCE``."""
    return job_name(key, "collect_evidence", "nr-evidence", nonce=nonce)


def none(why: str, *, now: datetime) -> Done:
    """The step's end where no job could run: said on the row, and the ladder goes on."""
    text = f"no evidence: {why}"
    return Done(text, context=RemediationContext(evidence_at=now.isoformat()), detail=EvidenceDetail(none=text))


def collect_evidence(inp: StepInput, ad: Adapters, cfg: StepSettings, *, now: datetime,
                     action: str | None = None) -> Outcome:
    """One look: start the job, poll it, or keep what it wrote. ``action``: the machine action that
    comes next (None: a quarantine comes next)."""
    job = plan(occasion(inp, action=action, quarantine=action is None), cfg.evidence)
    if inp.provider_op is None:
        return _start(inp, ad, cfg, job=job, now=now)
    validator = ad.validator
    if validator is None:  # the site's settings changed under it
        return none("the validation backend is gone (validation.backend none)", now=now)
    op = inp.provider_op
    result = look(validator, op, inp, now=now)
    cut = not result.done and elapsed(inp, now) >= cfg.evidence.max_wait_s
    if not result.done and not cut:
        poll = min(cfg.validation.poll_interval_s, cfg.workflow.max_wait_s)
        return Wait(f"collecting evidence on {inp.node} ({op['name']}) {still_running(result)}", poll)
    return _kept(inp, validator, op, result=result, now=now, cut=cut)


def _start(inp: StepInput, ad: Adapters, cfg: StepSettings, *, job: Plan, now: datetime) -> Outcome:
    """Start the job where one can run; else say why there is no evidence."""
    if cancel := human_took_back(inp, ad, cfg):
        return cancel
    if not job:
        return none("nothing to collect for this class and action (evidence.classes, evidence.journal)", now=now)
    validator = ad.validator
    if validator is None:
        return none("this site has no validation backend to run a job on the node (validation.backend none)",
                    now=now)
    if why := _cannot_run(inp, ad, validator, cfg=cfg):
        return none(why, now=now)
    nonce = JobNonce.load(inp.detail).value
    since = int(((inp.context.observed or inp.started_at) - timedelta(seconds=LOOKBACK_S)).timestamp())
    check = ValidationCheck(node=inp.node, name=evidence_name(inp.key, nonce),
                            command=job_command(job, nonce=nonce or inp.key, since=since),
                            timeout_s=min(job.timeout_s, cfg.evidence.max_wait_s + 30),
                            cause_class=cause_class(inp.context), purpose=PURPOSE, nonce=nonce,
                            output_bytes=job.output_bytes)
    op = {**start_job(validator, check, now), "items": [c.name for c in job.commands], "journal": bool(job.journal),
          "marker": nonce or inp.key}
    poll = min(cfg.validation.poll_interval_s, cfg.workflow.max_wait_s)
    return Wait(f"collecting evidence on {inp.node} ({validator.backend} job {op['name']})", poll, provider_op=op)


def _cannot_run(inp: StepInput, ad: Adapters, validator: Validator, *, cfg: StepSettings) -> str | None:
    """Why no job can run on the node now (None: one can)."""
    snode = ad.slurm.get_node(inp.node)
    if SlurmState.NOT_RESPONDING in snode.flags:
        return f"slurmd on {inp.node} is not responding, so no job can run there"
    if (theirs := humans_drain(inp, ad, validator, cfg=cfg)) is not None:
        return f"a human drained {inp.node} meanwhile ({theirs!r}); a job would lift that drain"
    # No look for jobs here: the drain before this step waited for them to end, and a job found now may
    # be this step's own, started by a worker killed before it could record it (``start`` finds it).
    return None


def _kept(inp: StepInput, validator: Validator, op: dict[str, Any], *, result: ValidationResult,
          now: datetime, cut: bool) -> Done:
    """The job ended (or was stopped): take its set-up down and keep what it wrote."""
    taken_down = validator.finish(op)
    at = RemediationContext(evidence_at=now.isoformat())
    if result.state == "DRY-RUN":
        return Done(f"would collect evidence on {inp.node} ({op['name']}: {', '.join(op['items']) or 'journal line'})",
                    context=at, detail=EvidenceDetail(job=op["name"]))
    items, journal = parse(result.output, nonce=str(op["marker"]), names=list(op["items"]))
    journal_said = journal if op.get("journal") else None
    detail = EvidenceDetail(tuple(items), journal_said, op["name"])
    said = summary(items) or "no command"
    stopped = " (stopped at evidence.max_wait_s)" if cut else ""
    line = f"; journal line {journal_said.value}" if journal_said is not None else ""
    if items and all(not i.content and i.exit_code is None for i in items):
        return Done(f"no evidence: the job {op['name']} ended ({result.state or 'unknown'}) before any command "
                    f"did{stopped}{line}; {taken_down}", context=at,
                    detail=EvidenceDetail(tuple(items), journal_said, op["name"], none="no evidence: job ended early"))
    return Done(f"collected from {inp.node}: {said}{stopped}{line}; {taken_down}", context=at, detail=detail)


__all__ = ["JournalLine", "collect_evidence", "evidence_name"]
