"""The ``gpu-reset`` rung: ``nvidia-smi -r`` on the node, as a job, before any reboot.

The job, run by the validator (:mod:`remediation.validation.port`), resets the GPU at the XID's PCI
address (``context.gpu_pci``, an argument, never shell text), or every GPU when the signal names none.
Exit 0 goes on to ``verify``; any other verdict climbs to the next rung. Job names come from the
step's idempotency key, so a killed worker never submits a second reset.

Why: docs/policy.md#fault-classes-the-cause-picks-the-first-action
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

from remediation.domain.context import RemediationContext
from remediation.domain.outcomes import (
    Adapters,
    Done,
    Escalate,
    Outcome,
    StepInput,
    StepSettings,
    Wait,
    elapsed,
    wait,
)
from remediation.domain.recheck import new_fault, trigger_present
from remediation.domain.slurm_states import SlurmState
from remediation.domain.states import ValidationOutcome
from remediation.domain.step_records import MachineDetail
from remediation.domain.stepdetail import JobNonce
from remediation.ports.cluster import DRY_RUN_REF
from remediation.validation.port import ValidationCheck
from remediation.validation.rules import (
    cause_class,
    humans_drain,
    job_name,
    job_runner,
    last_line,
    look,
    start_job,
    still_running,
    verdict,
)
from remediation.vocabulary import GPU_RESET

#: What the dry-run validator records, and what a check's ``purpose`` says for a reset.
PURPOSE = "reset GPU"
#: The script's exit code when no GPU of the node has the XID's PCI address.
NO_SUCH_GPU = 3
#: ``sh -c SCRIPT nr-gpu-reset PCI``: ``$1`` is the address as :func:`remediation.domain.causes.pci_id`
#: spells it (``0000:3b:00``), or empty for every GPU. nvidia-smi prints ``00000000:3B:00.0``: the awk
#: line brings it to that spelling (four-digit domain, lower case, no function) before comparing.
SCRIPT = r"""
if [ -z "$1" ]; then
  echo "gpu-reset: every GPU of $(hostname)"
  nvidia-smi -pm 0
  exec nvidia-smi -r
fi
gpus=$(nvidia-smi --query-gpu=index,pci.bus_id --format=csv,noheader) || exit
index=$(printf '%s\n' "$gpus" | awk -F', *' -v want="$1" '{
  split(tolower($2), a, ":"); d = a[1]; sub(/^0+/, "", d); while (length(d) < 4) d = "0" d
  if (d ":" a[2] ":" substr(a[3], 1, 2) == want) { print $1; exit } }')
if [ -z "$index" ]; then
  echo "gpu-reset: no GPU at PCI $1 on $(hostname)"
  exit 3
fi
echo "gpu-reset: GPU $index of $(hostname) is at PCI $1"
nvidia-smi -pm 0 -i "$index"
exec nvidia-smi -r -i "$index"
"""
_PCI = re.compile(r"[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}")


def reset_command(gpu_pci: str | None) -> tuple[str, ...]:
    """The job's argument list. An address not in our spelling (a row is data) resets every GPU
    rather than reaching the script."""
    pci = gpu_pci if gpu_pci and _PCI.fullmatch(gpu_pci) else ""
    return ("/bin/sh", "-c", SCRIPT, "nr-gpu-reset", pci)


def machine_step_did(op: dict[str, Any]) -> str:
    """What a machine step (``vm_restart``) did, read from the operation it recorded: the machine action
    (``restart``, ``stop_start``, ``redeploy``...), or ``gpu-reset``, the one job a machine step runs,
    which is no machine action."""
    return GPU_RESET if "action" not in op and "name" in op else str(op.get("action", "?"))


def reset_name(key: str, nonce: str = "") -> str:
    """Reservation, job and Job name of the reset from the machine step's key and nonce:
    ``r12:vm_restart:1`` -> ``nr-reset-r12-a1-NONCE``."""
    return job_name(key, "vm_restart", "nr-reset", nonce=nonce)


def target(gpu_pci: str | None) -> str:
    return f"GPU {gpu_pci}" if gpu_pci and _PCI.fullmatch(gpu_pci) else "every GPU"


def reset_check(inp: StepInput, cfg: StepSettings) -> ValidationCheck:
    nonce = JobNonce.load(inp.detail).value
    return ValidationCheck(node=inp.node, name=reset_name(inp.key, nonce), command=reset_command(inp.context.gpu_pci),
                           timeout_s=cfg.validation.gpu_reset_timeout_s, cause_class=cause_class(inp.context),
                           purpose=PURPOSE, nonce=nonce)


def gpu_reset(inp: StepInput, ad: Adapters, cfg: StepSettings, *, now: datetime) -> Outcome:
    """The machine step on a ``gpu-reset`` rung (its caller has already checked for jobs, a human's
    uncordon and the breaker's re-confirmation, as before any machine action)."""
    validator = job_runner(ad, "vm_restart")
    poll = min(cfg.validation.poll_interval_s, cfg.workflow.max_wait_s)
    what = f"{target(inp.context.gpu_pci)} of {inp.node}"
    if inp.provider_op is None:
        if SlurmState.NOT_RESPONDING in ad.slurm.get_node(inp.node).flags:
            return Escalate(f"no GPU reset: slurmd on {inp.node} is not responding, so no job can run there")
        if (theirs := humans_drain(inp, ad, validator, cfg=cfg)) is not None:
            return Escalate(f"no GPU reset: a human drained {inp.node} meanwhile ({theirs!r}), and the reset "
                            "job would lift that drain")
        op = start_job(validator, reset_check(inp, cfg), now)
        return Wait(f"GPU reset of {what} started ({validator.backend} job {op['name']})", poll, provider_op=op)
    op = inp.provider_op
    result = look(validator, op, inp, now=now)
    if not result.done:
        return Wait(f"GPU reset of {what} {still_running(result)}", poll)
    taken_down = validator.finish(op)
    outcome, rec = verdict(op, result, now, limit=cfg.validation.output_bytes)
    detail = MachineDetail(gpu_reset=rec, undone=taken_down)
    if outcome == ValidationOutcome.DRY_RUN:
        return Done(f"would reset {what} (nvidia-smi -r, {op['name']})", detail=detail,
                    context=RemediationContext(machine_op_ref=f"{DRY_RUN_REF}{op['name']}", machine_op_recorded=True))
    last = last_line(rec.output)
    said = f"exit {rec.exit_code} after {rec.duration_s:.1f}s{f': {last[:200]}' if last else ''}"
    if outcome == ValidationOutcome.PASSED:
        return Done(f"GPU reset of {what} done ({op['name']}: {said}); {taken_down}", detail=detail,
                    context=RemediationContext(machine_action_at=inp.started_at.isoformat(),
                                               machine_op_ref=op["name"], machine_op_recorded=False,
                                               reconfirm=False))
    why = {ValidationOutcome.FAILED: "the reset failed",
           ValidationOutcome.TIMEOUT: f"not done within {op['timeout_s']:g}s",
           ValidationOutcome.NO_RESULT: f"ended without a result ({rec.state or 'unknown'})",
           ValidationOutcome.CANNOT_RUN: "the reset could not run (is nvidia-smi on the node or in the image?)"}[outcome]
    return Escalate(f"GPU reset of {what}: {why} ({op['name']}: {said})", detail=detail)


def verify_reset(inp: StepInput, ad: Adapters, cfg: StepSettings, *, now: datetime) -> Outcome:
    """``verify`` after a GPU reset. Nothing rebooted, so there is no new bootID or slurmd start to
    prove: the job's exit 0 proved the action. What verify asks after any action still holds: slurmd
    answers and the trigger has cleared, within ``workflow.verify_timeout_s`` (a detector may take a
    while to see the GPU healthy; one that keeps the fault until a reboot climbs to the reboot)."""
    snode = ad.slurm.get_node(inp.node)
    knode = ad.node_now(inp.node, inp.context.k8s_node) if inp.context.k8s_node else None
    trigger = trigger_present(inp, ad, knode, snode=snode, cfg=cfg)
    fresh = new_fault(inp, knode, cfg)
    silent = SlurmState.NOT_RESPONDING in snode.flags
    if trigger is None and fresh is None and not silent:
        return Done(f"GPU reset proven by its job's exit 0 ({inp.context.machine_op_ref}); nothing rebooted; slurmd "
                    "answers; trigger cleared")
    still = trigger or (f"a new fault: {fresh}" if fresh else f"slurmd on {inp.node} not responding")
    if elapsed(inp, now) > cfg.workflow.verify_timeout_s:
        return Escalate(f"not recovered {cfg.workflow.verify_timeout_s}s after the GPU reset: {still}")
    return wait(cfg.workflow, f"waiting for the trigger to clear after the GPU reset: {still}")
