"""The typed remediation context reads every row the untyped dict wrote, and writes the same JSON."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

import pytest

from remediation.domain.context import RENAMED, Held, RemediationContext
from remediation.domain.controls import BreakerLatch, LastMachineAction, PauseState

# A row as the service wrote it before the context was typed, every key it used.
OLD_ROW: dict[str, Any] = {
    "event_state": "Ready=False", "reason": "kubelet stopped posting", "observed_at": "2026-03-01T00:00:00+00:00",
    "fault_class": "gpu-memory", "cause_class": "gpu-memory", "quarantine_reason": "repeat offender",
    "quarantine_decided": True, "quarantine_taken_back": "xid 79", "k8s_node": "gpu-node-3",
    "boot_id_before": "b-1", "provider_id": "gce://p/z/gpu-node-3", "we_cordoned": False,
    "vm_action_at": "2026-03-01T00:05:00+00:00", "vm_op_ref": "op-1", "reconfirm": True, "incident": 4,
    "incident_closed": 4, "held": {"kind": "unmapped builtins.ValueError", "error": "boom",
                                   "at": "2026-03-01T00:06:00+00:00", "step": "verify"},
}
#: Keys declared since the context was typed: no old row carries them, and one without them reads as None.
NEWER = {"no_kubernetes", "no_machine", "gpu_pci", "slurmctld_action_at", "slurmd_start_before", "machine_op_recorded",
         "domain_repair", "evidence_at", "no_evidence", "rma", "repair_request"}
#: The old row as this version writes it back: the renamed keys under their new names.
REWRITTEN = {RENAMED.get(k, k): v for k, v in OLD_ROW.items()}


def test_every_key_the_old_rows_carry_is_declared() -> None:
    declared = {f.name for f in fields(RemediationContext)} - {"extra"}
    assert declared == set(REWRITTEN) | NEWER
    assert RemediationContext.load({**OLD_ROW, "gpu_pci": "0000:3b:00"}).gpu_pci == "0000:3b:00"


def test_an_old_row_reads_typed_and_writes_back_unchanged() -> None:
    ctx = RemediationContext.load(OLD_ROW)
    assert ctx.held == Held("unmapped builtins.ValueError", "boom", "2026-03-01T00:06:00+00:00", "verify")
    assert ctx.condition == ("Ready", "False") and ctx.we_cordoned is False and ctx.incident == 4
    assert ctx.extra == {}
    assert ctx.dump() == REWRITTEN


def test_an_old_rows_vm_action_at_loads_as_machine_action_at() -> None:
    ctx = RemediationContext.load({"vm_action_at": "2026-03-01T00:05:00+00:00", "vm_op_ref": "op-1"})
    assert ctx.machine_action_at == "2026-03-01T00:05:00+00:00" and ctx.machine_op_ref == "op-1"
    assert ctx.extra == {}
    assert ctx.dump() == {"machine_action_at": "2026-03-01T00:05:00+00:00", "machine_op_ref": "op-1"}


def test_a_dry_run_action_is_known_by_its_flag_and_an_old_row_by_its_reference() -> None:
    """The flag decides; a row written before the flag has only the reference the dry-run twin named."""
    assert RemediationContext(machine_op_ref="op-1", machine_op_recorded=True).machine_op_recorded_only
    assert not RemediationContext(machine_op_ref="dry-run:k", machine_op_recorded=False).machine_op_recorded_only
    assert RemediationContext.load({"vm_op_ref": "dry-run:remediation-3-vm_restart-1"}).machine_op_recorded_only
    assert not RemediationContext.load({"vm_op_ref": "op-1"}).machine_op_recorded_only
    assert RemediationContext.load({"vm_op_ref": "op-1"}).dump() == {"machine_op_ref": "op-1"}  # unchanged


def test_the_new_key_wins_over_the_old_one() -> None:
    ctx = RemediationContext.load({"vm_action_at": "old", "machine_action_at": "new"})
    assert ctx.machine_action_at == "new" and ctx.dump() == {"machine_action_at": "new"}


@pytest.mark.parametrize(("raw", "expected"), [
    (None, RemediationContext()),
    ({}, RemediationContext()),
    ({"k8s_node": None}, RemediationContext()),
    ({"incident": "not a number"}, RemediationContext()),
    ({"incident": True}, RemediationContext()),
    ({"held": {}}, RemediationContext()),
    ({"reconfirm": 1}, RemediationContext(reconfirm=True)),
    ({"boot_id_before": 12}, RemediationContext(boot_id_before="12")),
], ids=["null", "empty", "null-value", "wrong-type", "bool-for-int", "empty-held", "truthy-flag", "number-as-text"])
def test_reading_is_tolerant(raw: dict[str, Any] | None, expected: RemediationContext) -> None:
    assert RemediationContext.load(raw) == expected


def test_a_key_this_version_does_not_know_survives_a_write() -> None:
    ctx = RemediationContext.load({"k8s_node": "n", "written_by_a_newer_version": [1, 2]})
    assert ctx.merged(RemediationContext(reconfirm=True)).dump() == {
        "written_by_a_newer_version": [1, 2], "k8s_node": "n", "reconfirm": True}


def test_a_step_sets_only_what_it_learnt() -> None:
    stored = RemediationContext(fault_class="nvlink", reconfirm=True, incident=3)
    learnt = RemediationContext(k8s_node="n", reconfirm=False)
    assert stored.merged(learnt) == RemediationContext(fault_class="nvlink", reconfirm=False, incident=3, k8s_node="n")


def test_control_rows_read_as_the_service_wrote_them() -> None:
    system = {"paused": True, "by": "system", "reason": "CredentialError: expired", "at": "2026-03-01T00:00:00",
              "error_kind": "CredentialError", "self_healing": True, "component": "slurm", "node": "gpu-node-3",
              "remediation": 7, "probe_ok": 0}
    pause = PauseState.load(system)
    assert (pause.paused, pause.self_healing, pause.probe_ok, pause.why) == (True, True, 0, "system: CredentialError: expired")
    assert pause.dump() == system
    closed = BreakerLatch.load({"open": False, "closed_at": "2026-03-01T00:00:00+00:00", "closed_by": "alice"})
    assert closed.closed is not None and BreakerLatch.load({"open": True, "closed_at": "x"}).closed is None
    assert LastMachineAction.load({"at": "not a time"}).when is None and PauseState.load(None) == PauseState()
