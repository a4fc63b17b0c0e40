"""The ``validate`` step: a GPU check chosen by the cause runs on the node before it returns.

The first look starts the check through the :class:`~remediation.validation.port.Validator` (names
from the step's idempotency key and nonce) and records its reference; later looks poll it. Exit 0
passes; any other exit fails and climbs the ladder; a deadline, no result, or exit 126/127 holds the
node and pages. The check's record travels in the outcome's ``detail["validation"]``.

Why: docs/policy.md#validate-before-return-a-gpu-validation-validationbackend-default-none
"""

from __future__ import annotations

import hashlib
import re
from datetime import datetime
from typing import Any

from remediation.domain.context import RemediationContext
from remediation.domain.outcomes import (
    Adapters,
    Done,
    Escalate,
    Hold,
    Outcome,
    StepInput,
    StepSettings,
    Wait,
    elapsed,
)
from remediation.domain.recheck import human_took_back
from remediation.domain.slurm_states import SlurmState
from remediation.domain.states import ValidationOutcome
from remediation.domain.step_records import GpuCheckDetail, JobRecord
from remediation.domain.stepdetail import JobNonce
from remediation.ports.errors import ConfigError
from remediation.settings import ValidationSettings
from remediation.validation.port import Backend, ValidationCheck, ValidationResult, Validator

#: Exit codes a shell gives a command it could not run: not executable, not found.
CANNOT_RUN = frozenset({126, 127})
#: Slack over the check's own deadline before the step gives up on a backend that never ended it.
DEADLINE_SLACK_S = 30.0


def check_name(key: str, nonce: str = "") -> str:
    """Reservation, job and Job name from an idempotency key and the step's nonce: ``r12:validate:1``
    -> ``nr-gate-r12-a1-NONCE``. Lower case letters, digits and dashes only, so it is valid in Slurm
    and as a Kubernetes name."""
    return job_name(key, "validate", "nr-gate", nonce=nonce)


def job_name(key: str, step: str, prefix: str, *, nonce: str = "") -> str:
    """The name of a job a step runs on the node, from the step's idempotency key and the nonce its
    row recorded (:class:`~remediation.domain.stepdetail.JobNonce`): ``r12:STEP:1`` ->
    ``PREFIX-r12-a1-NONCE``. One attempt, one name: a redelivered step finds the job the first delivery
    started, and nobody else can name a job ours in advance. A row without a nonce (made before it
    was recorded) keeps the name it always had."""
    rid, _, attempt = key.partition(f":{step}:")
    return _slug(f"{prefix}-{rid}-a{attempt or '1'}" + (f"-{nonce}" if nonce else ""))


def manual_check_name(node: str, stamp: str, nonce: str = "") -> str:
    """The names of a check a human asked for (``remediation validate``)."""
    return _slug(f"nr-gate-{node}-{stamp}" + (f"-{nonce}" if nonce else ""))


#: Kubernetes' limit for a name that is also a label value (the Job's ``job-name`` label), and plenty for Slurm.
NAME_MAX = 63
#: Hex digits of the SHA-256 of the whole input appended to a name that had to change: 40 bits.
_HASH_LEN = 10


def _slug(text: str) -> str:
    """``text`` as a name, one-to-one: a name names one node's check, or two nodes would share a
    reservation, a state file and a job, and one could be released on the other's verdict. A text that
    is already a short, valid name is kept as it is (a check started before an upgrade is found again
    by its name); any other keeps a readable prefix and ends in a hash of the whole, uncut text."""
    slug = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
    if slug == text and len(slug) <= NAME_MAX:
        return slug
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()[:_HASH_LEN]
    return f"{slug[:NAME_MAX - _HASH_LEN - 1].rstrip('-')}-{digest}"


def cause_class(context: RemediationContext) -> str:
    """The remediation's cause class, as the fault classifier recorded it; ``unknown`` without one."""
    return context.cause_class or context.fault_class or "unknown"


def tail(text: str, limit: int) -> str:
    """The last ``limit`` bytes of ``text`` (UTF-8), cut on a character boundary."""
    data = text.encode("utf-8", "replace")
    return text if len(data) <= limit else data[-limit:].decode("utf-8", "ignore")


def check_for(cfg: ValidationSettings, node: str, name: str, *, cls: str, nonce: str = "") -> ValidationCheck:
    return ValidationCheck(node=node, name=name, command=tuple(cfg.check_for(cls)), timeout_s=cfg.timeout_for(cls),
                           cause_class=cls, nonce=nonce)


def record(check: dict[str, Any], result: ValidationResult, outcome: ValidationOutcome, *, now: datetime,
           limit: int) -> JobRecord:
    """What the database keeps of one check (remediation.validation.service writes it)."""
    started = datetime.fromisoformat(check["started_at"])
    return JobRecord(
        started_at=started, finished_at=now, outcome=outcome, backend=check.get("backend", ""),
        name=check.get("name", ""), node=check.get("node", ""), cause_class=check.get("cause_class", "unknown"),
        command=tuple(check.get("command", [])), exit_code=result.exit_code, state=result.state,
        duration_s=round((now - started).total_seconds(), 3), output=tail(result.output, limit),
    )


def verdict(check: dict[str, Any], result: ValidationResult, now: datetime,
            *, limit: int) -> tuple[ValidationOutcome, JobRecord]:
    """passed / failed / timeout / no_result / cannot_run / dry_run, and the record to keep."""
    if result.state == "DRY-RUN":
        outcome = ValidationOutcome.DRY_RUN
    elif result.timed_out:
        outcome = ValidationOutcome.TIMEOUT
    elif result.exit_code is None:
        outcome = ValidationOutcome.NO_RESULT  # cancelled, node failure, or the record and its output both gone
    elif result.exit_code in CANNOT_RUN:
        outcome = ValidationOutcome.CANNOT_RUN
    else:
        outcome = ValidationOutcome.PASSED if result.exit_code == 0 else ValidationOutcome.FAILED
    return outcome, record(check, result, outcome, now=now, limit=limit)


def last_line(output: str) -> str:
    """The check's last word: its last non-empty line (the Slurm validator's own exit marker skipped)."""
    for line in reversed(output.splitlines()):
        if line.strip() and not line.startswith("nr-gate-exit:"):
            return line.strip()
    return ""


def describe(rec: JobRecord) -> str:
    cmd = " ".join(rec.command)
    last = last_line(rec.output)
    said = f": {last[:200]}" if last else ""
    return f"`{cmd}` on {rec.node} ({rec.cause_class}) exit {rec.exit_code} after {rec.duration_s:.1f}s{said}"


def job_runner(ad: Adapters, step: str) -> Validator:
    """The validator, which runs every job this service runs on a node (the GPU check, a GPU reset)."""
    if ad.validator is None:
        raise ConfigError(f"the {step} step ran without a validation (validation.backend)", component="validation")
    return ad.validator


def humans_drain(inp: StepInput, ad: Adapters, validator: Validator, *, cfg: StepSettings) -> str | None:
    """The reason of a drain a human placed meanwhile, where the job would lift it: the Slurm validator
    resumes the node into its reservation, and a human's drain is theirs (None: go ahead)."""
    if validator.backend != Backend.SLURM:
        return None
    snode = ad.slurm.get_node(inp.node)
    if SlurmState.DRAIN in snode.flags and not snode.reason_is_ours(cfg.policy.our_reason_prefix):
        return snode.reason
    return None


def start_job(validator: Validator, check: ValidationCheck, now: datetime) -> dict[str, Any]:
    """Start ``check`` and return what the step records before anyone waits on it (the validator's own
    reference plus what :func:`look` and the record need)."""
    ref = validator.start(check)
    return {**ref, "backend": validator.backend, "name": check.name, "node": check.node,
            "command": list(check.command), "cause_class": check.cause_class, "timeout_s": check.timeout_s,
            "started_at": now.isoformat()}


def is_job_ref(op: object) -> bool:
    """Whether a step row's ``provider_op`` is a started job's reference (:func:`start_job`), not a
    machine action's or a checkpoint request's."""
    return isinstance(op, dict) and {"backend", "name", "node", "started_at"} <= op.keys() and "action" not in op


def look(validator: Validator, op: dict[str, Any], inp: StepInput, *, now: datetime) -> ValidationResult:
    """One look at a started job. Past its deadline (and the slack the backend gets to end it itself) a
    job still running is ended here and reads as timed out; a done result means the set-up is down."""
    result = validator.poll(op)
    if not result.done:
        if elapsed(inp, now) <= float(op["timeout_s"]) + DEADLINE_SLACK_S:
            return result
        result = ValidationResult(done=True, exit_code=result.exit_code, output=result.output, state=result.state,
                                  timed_out=True)
    return result


def still_running(result: ValidationResult) -> str:
    """Why a job that is not done has not ended, for on-call."""
    return f"pending: {result.waiting}" if result.waiting else (result.state or "running").lower()


def validate(inp: StepInput, ad: Adapters, cfg: StepSettings, *, now: datetime) -> Outcome:
    validator = job_runner(ad, "validate")
    if inp.context.machine_op_recorded_only:
        return Done("nothing was restarted (dry-run), so no GPU check is run")
    vcfg = cfg.validation
    poll = min(vcfg.poll_interval_s, cfg.workflow.max_wait_s)
    if inp.provider_op is None:
        if cancel := human_took_back(inp, ad, cfg):
            return cancel
        if (theirs := humans_drain(inp, ad, validator, cfg=cfg)) is not None:
            return Done(f"no GPU check: a human drained {inp.node} meanwhile ({theirs!r}); the node "
                        "stays out for its owner")
        nonce = JobNonce.load(inp.detail).value
        check = check_for(vcfg, inp.node, check_name(inp.key, nonce), cls=cause_class(inp.context),
                          nonce=nonce)
        op = start_job(validator, check, now)
        return Wait(f"GPU check started on {inp.node} ({validator.backend}): {' '.join(check.command)}", poll,
                    provider_op=op)
    op = inp.provider_op
    result = look(validator, op, inp, now=now)
    if not result.done:
        return Wait(f"GPU check on {inp.node} {still_running(result)}: {' '.join(op['command'])}", poll)
    taken_down = validator.finish(op)
    outcome, rec = verdict(op, result, now, limit=vcfg.output_bytes)
    detail = GpuCheckDetail(rec, taken_down)
    what = describe(rec)
    if outcome == ValidationOutcome.DRY_RUN:
        return Done(f"would run the GPU check {' '.join(op['command'])} on {inp.node}", detail=detail)
    if outcome == ValidationOutcome.PASSED:
        return Done(f"GPU check passed: {what}; {taken_down}", detail=detail)
    if outcome == ValidationOutcome.FAILED:
        return Escalate(f"GPU check failed: {what}", detail=detail)
    if outcome == ValidationOutcome.TIMEOUT:
        return Hold(f"GPU check did not finish within {op['timeout_s']:g}s: {what}; node held until a human "
                    f"decides (resume runs it again, cancel gives the node back)", "ValidationTimeout", detail)
    if outcome == ValidationOutcome.NO_RESULT:
        return Hold(f"GPU check ended without a result ({rec.state or 'unknown'}): {what}; node held",
                    "ValidationNoResult", detail)
    return Hold(f"GPU check could not run (exit {rec.exit_code}: is it installed on the node or in the image?): "
                f"{what}; node held", "ValidationCannotRun", detail)
