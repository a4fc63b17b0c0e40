"""The collect_evidence step at our own port: a job cut at evidence.max_wait_s keeps what it wrote, a
dry run records what it would collect, and a human's drain or a silent slurmd leave no job started."""

from __future__ import annotations

import subprocess
from datetime import UTC, datetime, timedelta
from typing import Any

from remediation.adapters.memory import MemoryKube, MemorySlurm, MemoryVM, MemoryWorld
from remediation.adapters.noop import NoopValidator
from remediation.domain.context import RemediationContext
from remediation.domain.outcomes import Adapters, Done, StepInput, StepSettings, Wait
from remediation.domain.step_records import EvidenceDetail
from remediation.evidence_collection.rules import EvidenceStatus
from remediation.evidence_collection.step import collect_evidence
from remediation.settings import load_settings
from remediation.validation.port import ValidationResult
from tests.scripted_validator import ScriptedValidator

T0 = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
NODE = "gpu-node-4"
CFG = StepSettings.of(load_settings(validation={"backend": "slurm", "poll_interval_s": 2}))


def inp(op: dict[str, Any] | None = None) -> StepInput:
    return StepInput(remediation_id=3, node=NODE, cause="slurm FAIL: xid 79", ladder=0,
                     context=RemediationContext(fault_class="gpu-hardware", observed_at=T0.isoformat()),
                     key="r3:collect_evidence:1", attempt=1, started_at=T0, checks=0 if op is None else 1,
                     provider_op=op, detail={"nonce": "00112233aa"}, source="slurm")


def adapters(validator: Any, **slurm: Any) -> Adapters:
    world = MemoryWorld(nodes=[NODE])
    world.set_slurm(NODE, **{"state": "IDLE", "flags": ["DRAIN"], "reason": "remediation: slurm FAIL: xid 79",
                             **slurm})
    return Adapters(MemorySlurm(world), MemoryKube(world), MemoryVM(world), validator)


def started(validator: ScriptedValidator) -> dict[str, Any]:
    out = collect_evidence(inp(), adapters(validator), CFG, now=T0, action="move-host")
    assert isinstance(out, Wait) and out.provider_op is not None, out
    return out.provider_op


def test_the_job_is_named_for_the_key_and_nonce_and_asks_for_all_its_output() -> None:
    validator = ScriptedValidator([])
    op = started(validator)
    (_, check), = validator.calls
    assert check.name == op["name"] == "nr-evidence-r3-a1-00112233aa" and check.purpose == "collect evidence"
    assert check.command[:2] == ("/bin/bash", "-c") and check.output_bytes > CFG.validation.output_bytes
    assert op["items"] == ["nvidia-smi-q", "remapped-rows", "kernel-log"] and op["journal"] is True
    since = int((T0 - timedelta(seconds=600)).timestamp())  # the kernel log from before the fault
    assert f"@{since}" in check.command


def partial_output(op: dict[str, Any]) -> str:
    """What the job wrote before it was stopped: the first command's frame, as the script prints it."""
    done = subprocess.run(["/bin/bash", "-c", op["command"][2], "nr-evidence", op["marker"], "",
                           "nvidia-smi-q", "5", "100", "2", "/bin/echo", "GPU 00000000:3B:00.0"],
                          capture_output=True, text=True, timeout=30, check=True)
    return done.stdout


def test_a_job_still_running_at_max_wait_is_stopped_and_what_it_wrote_is_kept() -> None:
    op = started(ScriptedValidator([]))
    still = ValidationResult(False, None, partial_output(op), "RUNNING")
    validator = ScriptedValidator([still, still])
    early = collect_evidence(inp(op), adapters(validator), CFG, now=T0 + timedelta(seconds=30), action="move-host")
    assert isinstance(early, Wait)  # within evidence.max_wait_s (90 s): it waits
    out = collect_evidence(inp(op), adapters(validator), CFG, now=T0 + timedelta(seconds=91), action="move-host")
    assert isinstance(out, Done) and isinstance(out.detail, EvidenceDetail), out
    assert [(i.name, i.status) for i in out.detail.items] == [
        ("nvidia-smi-q", EvidenceStatus.COLLECTED), ("remapped-rows", EvidenceStatus.CUT),
        ("kernel-log", EvidenceStatus.CUT)]
    assert out.detail.items[0].content == b"GPU 00000000:3B:00.0\n"
    assert "(stopped at evidence.max_wait_s)" in out.outcome and ("finish", op["name"]) in validator.calls
    assert out.context.evidence_at == (T0 + timedelta(seconds=91)).isoformat()


def test_a_dry_run_records_what_it_would_collect_and_keeps_nothing() -> None:
    noop = NoopValidator()
    first = collect_evidence(inp(), adapters(noop), CFG, now=T0, action="move-host")
    assert isinstance(first, Wait) and first.provider_op is not None
    out = collect_evidence(inp(first.provider_op), adapters(noop), CFG, now=T0, action="move-host")
    assert isinstance(out, Done) and out.outcome.startswith("would collect evidence on gpu-node-4")
    assert isinstance(out.detail, EvidenceDetail) and out.detail.items == ()
    assert [r["would"] for r in noop.recorder.actions] == ["collect evidence"]


def test_a_humans_drain_or_a_silent_slurmd_leave_no_job_started() -> None:
    validator = ScriptedValidator([], backend="slurm")  # whose job would lift a drain into its reservation
    theirs = collect_evidence(inp(), adapters(validator, reason="alice: bad fan"), CFG, now=T0, action="restart")
    assert isinstance(theirs, Done) and theirs.outcome.startswith("no evidence: a human drained gpu-node-4")
    silent = collect_evidence(inp(), adapters(validator, flags=["DRAIN", "NOT_RESPONDING"]), CFG, now=T0,
                              action="restart")
    assert isinstance(silent, Done) and silent.outcome == (
        "no evidence: slurmd on gpu-node-4 is not responding, so no job can run there")
    assert validator.calls == []
