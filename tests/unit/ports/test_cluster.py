"""An operation the dry-run twin recorded says so by a flag, stored with it; a row written before the
flag is known by the reference the twin gave it."""

from __future__ import annotations

from remediation.adapters.noop import NoopMachine
from remediation.ports.cluster import Operation, VMAction, VMRef

VM = VMRef("gce", "gpu-node-1", zone="z", account="p")


def test_the_dry_run_twin_flags_what_it_only_recorded() -> None:
    op = NoopMachine().start(VM, VMAction.RESTART, "remediation-1-vm_restart-1")
    assert op.recorded_only
    assert Operation.from_dict(op.to_dict()).recorded_only


def test_a_real_operation_is_not_flagged_whatever_its_reference_says() -> None:
    op = Operation("gce", "dry-run:looks-like-ours", VMAction.RESTART, VM)
    assert not Operation.from_dict(op.to_dict()).recorded_only


def test_a_row_written_before_the_flag_reads_by_its_reference() -> None:
    old = {"provider": "gce", "ref": "dry-run:remediation-1-vm_restart-1", "action": "restart", "vm": VM.to_dict()}
    assert Operation.from_dict(old).recorded_only
    assert not Operation.from_dict({**old, "ref": "operation-123"}).recorded_only
