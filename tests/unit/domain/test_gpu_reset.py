"""The gpu-reset rung at our own port: the job it starts (and its script, run here against a stand-in
nvidia-smi), the verdicts, the skips, dry-run, verify after a reset, and the machine step choosing the
reset only where a job can run on a node."""

from __future__ import annotations

import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from remediation.adapters.memory import MemoryKube, MemorySlurm, MemoryVM, MemoryWorld
from remediation.adapters.noop import NoopValidator
from remediation.domain.context import RemediationContext
from remediation.domain.gpu_reset import NO_SUCH_GPU, reset_command, reset_name
from remediation.domain.outcomes import Adapters, Done, Escalate, StepInput, StepSettings, Wait
from remediation.domain.statemachine import Site, Step, next_on_success
from remediation.domain.step_bodies import verify, vm_restart
from remediation.domain.step_records import MachineDetail
from remediation.settings import load_settings
from remediation.validation.port import ValidationResult
from tests.scripted_validator import ScriptedValidator

T0 = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
NODE = "gpu-node-3"
LADDER = {"gpu-transient": ["gpu-reset", "restart", "move-host", "quarantine"]}


def cfg(backend: str = "slurm") -> StepSettings:
    return StepSettings.of(load_settings(
        policy={"faults": {"classify": True, "ladders": LADDER}},
        validation={"backend": backend, "poll_interval_s": 2}))


#: slurmd's start, recorded in a write of its own before a machine action (none yet, as in a new cluster)
RECORDED = {"slurmd_start_before": ""}


def inp(op: dict[str, Any] | None = None, pci: str | None = "0000:3b:00", ladder: int = 0, started: datetime = T0,
        **ctx: Any) -> StepInput:
    context = RemediationContext(fault_class="gpu-transient", gpu_pci=pci, provider_id=f"memory:///{NODE}", **ctx)
    return StepInput(remediation_id=7, node=NODE, cause="xid 46", ladder=ladder, context=context,
                     key="r7:vm_restart:1", attempt=1, started_at=started, checks=0 if op is None else 1,
                     provider_op=op, detail=RECORDED, source="slurm")


def adapters(validator: Any, world: MemoryWorld | None = None) -> Adapters:
    world = world or MemoryWorld(nodes=[NODE])
    return Adapters(MemorySlurm(world), MemoryKube(world), MemoryVM(world), validator)


def started(validator: ScriptedValidator, pci: str | None = "0000:3b:00") -> dict[str, Any]:
    out = vm_restart(inp(pci=pci), adapters(validator), cfg(), now=T0)
    assert isinstance(out, Wait) and out.provider_op is not None, out
    return out.provider_op


def test_the_first_look_starts_one_reset_job_named_for_the_key_and_records_it() -> None:
    validator = ScriptedValidator([])
    op = started(validator)
    (_, check), = validator.calls
    assert check.name == reset_name("r7:vm_restart:1") == "nr-reset-r7-a1"
    assert check.command == reset_command("0000:3b:00") and check.command[-1] == "0000:3b:00"
    assert (check.timeout_s, check.purpose, check.node) == (300.0, "reset GPU", NODE)
    assert op["job_id"] == "42" and op["name"] == "nr-reset-r7-a1" and op["started_at"] == T0.isoformat()


def finish(result: ValidationResult, at: datetime = T0 + timedelta(seconds=20)) -> tuple[Any, ScriptedValidator]:
    op = started(ScriptedValidator([]))
    validator = ScriptedValidator([result])
    return vm_restart(inp(op), adapters(validator), cfg(), now=at), validator


def test_exit_0_is_the_proof_and_moves_on_to_verify() -> None:
    out, validator = finish(ValidationResult(True, 0, "gpu-reset: GPU 2 is at PCI 0000:3b:00\nGPU reset\n"))
    assert isinstance(out, Done) and "GPU reset of GPU 0000:3b:00" in out.outcome and "exit 0" in out.outcome
    assert out.context.machine_op_ref == "nr-reset-r7-a1" and out.context.machine_action_at == T0.isoformat()
    assert isinstance(out.detail, MachineDetail) and out.detail.gpu_reset is not None
    assert out.detail.gpu_reset.exit_code == 0 and validator.calls[-1] == ("finish", "nr-reset-r7-a1")


@pytest.mark.parametrize(("result", "said"), [
    (ValidationResult(True, 255, "Unable to reset this GPU because it's being used by some other process"),
     "the reset failed"),
    (ValidationResult(True, NO_SUCH_GPU, "gpu-reset: no GPU at PCI 0000:3b:00"), "the reset failed"),
    (ValidationResult(True, None, "", state="TIMEOUT", timed_out=True), "not done within 300s"),
    (ValidationResult(True, None, "", state="CANCELLED"), "without a result (CANCELLED)"),
    (ValidationResult(True, 127, "sh: nvidia-smi: not found"), "could not run"),
], ids=["refused", "no-such-gpu", "deadline", "cancelled", "no-nvidia-smi"])
def test_any_other_verdict_climbs_to_the_next_rung(result: ValidationResult, said: str) -> None:
    out, validator = finish(result)
    assert isinstance(out, Escalate) and said in out.reason, out
    assert isinstance(out.detail, MachineDetail) and out.detail.gpu_reset is not None
    assert out.detail.gpu_reset.output == result.output and validator.calls[-1][0] == "finish"


def test_running_waits_then_our_own_deadline_ends_it() -> None:
    op = started(ScriptedValidator([]))
    out = vm_restart(inp(op), adapters(ScriptedValidator([ValidationResult(False, state="PENDING",
                                                                            waiting="Reservation")])),
                     cfg(), now=T0 + timedelta(seconds=10))
    assert isinstance(out, Wait) and "pending: Reservation" in out.reason
    validator = ScriptedValidator([ValidationResult(False, state="RUNNING")])
    out = vm_restart(inp(op), adapters(validator), cfg(), now=T0 + timedelta(seconds=331))
    assert isinstance(out, Escalate) and "not done within 300s" in out.reason and validator.calls[-1][0] == "finish"


def test_a_node_whose_slurmd_is_silent_or_that_a_human_drained_skips_the_reset() -> None:
    world = MemoryWorld(nodes=[NODE])
    world.set_slurm(NODE, flags=["DRAIN", "NOT_RESPONDING"], reason="remediation: xid 46")
    validator = ScriptedValidator([])
    out = vm_restart(inp(), adapters(validator, world), cfg(), now=T0)
    assert isinstance(out, Escalate) and "not responding" in out.reason and validator.calls == []
    world.set_slurm(NODE, flags=["DRAIN"], reason="maintenance: HBM reseat")
    validator.backend = "slurm"
    out = vm_restart(inp(), adapters(validator, world), cfg(), now=T0)
    assert isinstance(out, Escalate) and "a human drained" in out.reason and validator.calls == []


def test_dry_run_records_would_reset_gpu_and_judges_nothing() -> None:
    validator = NoopValidator()
    out = vm_restart(inp(pci=None), adapters(validator), cfg(), now=T0)
    assert isinstance(out, Wait) and out.provider_op is not None
    out = vm_restart(inp(out.provider_op, pci=None), adapters(validator), cfg(),
                     now=T0 + timedelta(seconds=1))
    assert isinstance(out, Done) and out.outcome.startswith("would reset every GPU of gpu-node-3")
    assert [a["would"] for a in validator.recorder.actions] == ["reset GPU"]
    assert (out.context.machine_op_ref or "").startswith("dry-run:")  # verify and the GPU check judge nothing


def test_without_a_job_runner_the_rung_is_left_out_and_the_machine_restarts() -> None:
    world = MemoryWorld(nodes=[NODE])
    out = vm_restart(inp(), adapters(None, world), cfg(backend="none"), now=T0)
    assert isinstance(out, Wait) and out.provider_op is not None and out.provider_op["action"] == "restart"
    # With a job runner, rung 1 is the restart.
    out = vm_restart(inp(ladder=1), adapters(ScriptedValidator([]), world), cfg(), now=T0)
    assert isinstance(out, Wait) and out.provider_op is not None and out.provider_op["action"] == "restart"


def test_verify_after_a_reset_asks_no_new_boot_but_the_trigger_must_clear() -> None:
    world = MemoryWorld(nodes=[NODE])
    world.set_slurm(NODE, flags=["DRAIN"], reason="remediation: xid 46")
    after = {"machine_op_ref": "nr-reset-r7-a1", "machine_action_at": T0.isoformat(), "event_state": "FAIL"}
    out = verify(inp(**after), adapters(ScriptedValidator([]), world), cfg(), now=T0 + timedelta(seconds=5))
    assert isinstance(out, Done) and "nothing rebooted" in out.outcome
    world.set_slurm(NODE, flags=["FAIL"], reason="xid 46 again -- bob")  # a researcher's new verdict
    out = verify(inp(**after), adapters(ScriptedValidator([]), world), cfg(), now=T0 + timedelta(seconds=5))
    assert isinstance(out, Wait) and "after the GPU reset" in out.reason
    late = T0 + timedelta(seconds=cfg().workflow.verify_timeout_s + 1)
    out = verify(inp(**after), adapters(ScriptedValidator([]), world), cfg(), now=late)
    assert isinstance(out, Escalate) and "after the GPU reset" in out.reason


@pytest.mark.parametrize(("said", "returned"), [("Xid 79, GPU has fallen off the bus", False),
                                                ("Xid 31, MMU fault in a user's kernel", True)], ids=["fatal", "app"])
def test_verify_after_a_reset_holds_a_node_that_reports_a_new_fault(said: str, returned: bool) -> None:
    world = MemoryWorld(nodes=[NODE])
    world.set_slurm(NODE, flags=["DRAIN"], reason="remediation: xid 46")
    world.set_k8s(NODE, conditions={"GpuXidError": "True"}, messages={"GpuXidError": said})
    after = {"machine_op_ref": "nr-reset-r7-a1", "machine_action_at": T0.isoformat(), "event_state": "FAIL",
             "k8s_node": NODE}
    out = verify(inp(**after), adapters(ScriptedValidator([]), world), cfg(), now=T0 + timedelta(seconds=5))
    if returned:
        assert isinstance(out, Done), out
        return
    assert isinstance(out, Wait) and f"a new fault: GpuXidError=True on {NODE} ({said})" in out.reason
    late = T0 + timedelta(seconds=cfg().workflow.verify_timeout_s + 1)
    out = verify(inp(**after), adapters(ScriptedValidator([]), world), cfg(), now=late)
    assert isinstance(out, Escalate) and "a new fault" in out.reason


SMI = """#!/bin/sh
echo "$*" >> "$(dirname "$0")/argv"
case "$1" in
  --query-gpu=index,pci.bus_id) printf '0, 00000000:1B:00.0\\n1, 00000000:3B:00.0\\n2, 00000000:5D:00.0\\n' ;;
esac
"""


@pytest.mark.parametrize(("pci", "calls", "code"), [
    ("0000:3b:00", ["--query-gpu=index,pci.bus_id --format=csv,noheader", "-pm 0 -i 1", "-r -i 1"], 0),
    ("0000:5d:00", ["--query-gpu=index,pci.bus_id --format=csv,noheader", "-pm 0 -i 2", "-r -i 2"], 0),
    (None, ["-pm 0", "-r"], 0),
    ("0000:af:00", ["--query-gpu=index,pci.bus_id --format=csv,noheader"], NO_SUCH_GPU),
], ids=["bus-3b-is-gpu-1", "bus-5d-is-gpu-2", "every-gpu", "no-such-gpu"])
def test_the_script_maps_the_address_to_the_index_the_job_sees(tmp_path: Path, pci: str | None,
                                                               calls: list[str], code: int) -> None:
    smi = tmp_path / "nvidia-smi"
    smi.write_text(SMI)
    smi.chmod(0o755)
    ran = subprocess.run(list(reset_command(pci)), env={"PATH": f"{tmp_path}:/usr/bin:/bin"},  # noqa: S603
                         capture_output=True, text=True, timeout=10, check=False)
    assert ran.returncode == code, ran
    assert (tmp_path / "argv").read_text().splitlines() == calls


def test_an_address_not_in_our_spelling_never_reaches_the_script() -> None:
    assert reset_command("0000:3b:00; reboot")[-1] == "" and reset_command("../x")[-1] == ""


def test_a_site_without_a_machine_backend_still_resets_gpus() -> None:
    site = Site(kubernetes=False, machine=False, validation=True)
    assert Step.VM_RESTART not in site.path(acts=True)  # no machine rung can be climbed here
    assert site.path(acts=True, resets=True) == (Step.SLURM_DRAIN, Step.VM_RESTART, Step.VERIFY, Step.VALIDATE,
                                                 Step.RETURN, Step.DONE)
    assert next_on_success(Step.SLURM_DRAIN, site, resets=True) is Step.VM_RESTART
    world = MemoryWorld(nodes=[NODE])
    validator = ScriptedValidator([])
    out = vm_restart(inp(), Adapters(MemorySlurm(world), None, None, validator), cfg(), now=T0)
    assert isinstance(out, Wait) and out.provider_op is not None and out.provider_op["name"] == "nr-reset-r7-a1"
