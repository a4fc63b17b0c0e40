"""GCEProvider through google-cloud-compute's REST transport against the local Compute Engine fake."""

from __future__ import annotations

import pytest

from remediation.adapters.cloud.gce import GCEProvider
from remediation.ports.cluster import Operation, VMAction, VMRef
from remediation.ports.errors import CredentialError, NotFound, NotSupported, TransientError
from remediation.settings import MachineSettings
from remediation.simulator.gce_api import GceFake
from tests.integration.cloud.conftest import PROJECT, ZONE, wait_done

RESET = "/instances/gpu-1/reset"


def vm(name: str = "gpu-1") -> VMRef:
    return VMRef("gce", name, zone=ZONE, account=PROJECT, provider_id=f"gce://{PROJECT}/{ZONE}/{name}")


def test_restart_resets_once_and_boots_again(gce_fake: GceFake, gce_settings: MachineSettings) -> None:
    provider = GCEProvider(gce_settings)
    op = provider.start(vm(), VMAction.RESTART, "rem-1:vm_restart:1")
    assert op.provider == "gce" and op.ref.startswith("operation-")
    status, _ = wait_done(provider, op)
    assert status.error is None
    state = gce_fake.vm(PROJECT, ZONE, "gpu-1")
    assert (state["status"], state["boot_count"]) == ("RUNNING", 2)
    assert gce_fake.log.count("POST", RESET) == 1


def test_same_key_twice_is_one_reset(gce_fake: GceFake, gce_settings: MachineSettings) -> None:
    # The worker crashed after start() and before the op was persisted: a new process retries.
    first = GCEProvider(gce_settings).start(vm(), VMAction.RESTART, "rem-2:vm_restart:1")
    again = GCEProvider(gce_settings).start(vm(), VMAction.RESTART, "rem-2:vm_restart:1")
    assert again.ref == first.ref
    wait_done(GCEProvider(gce_settings), again)
    assert gce_fake.log.count("POST", RESET) == 2  # asked twice...
    assert gce_fake.actions("reset", "gpu-1") == 1  # ...acted once
    assert gce_fake.vm(PROJECT, ZONE, "gpu-1")["boot_count"] == 2


def test_a_new_key_acts_again(gce_fake: GceFake, gce_settings: MachineSettings) -> None:
    provider = GCEProvider(gce_settings)
    wait_done(provider, provider.start(vm(), VMAction.RESTART, "rem-3:vm_restart:1"))
    wait_done(provider, provider.start(vm(), VMAction.RESTART, "rem-3:vm_restart:2"))
    assert gce_fake.actions("reset", "gpu-1") == 2
    assert gce_fake.vm(PROJECT, ZONE, "gpu-1")["boot_count"] == 3


def test_resume_polling_in_a_fresh_provider(gce_fake: GceFake, gce_settings: MachineSettings) -> None:
    gce_fake.op_seconds = 0.3
    row = GCEProvider(gce_settings).start(vm(), VMAction.RESTART, "rem-4:vm_restart:1").to_dict()
    resumed = Operation.from_dict(row)
    assert GCEProvider(gce_settings).poll(resumed).done is False
    status, _ = wait_done(GCEProvider(gce_settings), resumed)
    assert status.done and status.error is None
    assert gce_fake.vm(PROJECT, ZONE, "gpu-1")["boot_count"] == 2


def test_stop_start_runs_both_phases(gce_fake: GceFake, gce_settings: MachineSettings) -> None:
    provider = GCEProvider(gce_settings)
    op = provider.start(vm("gpu-2"), VMAction.STOP_START, "rem-5:vm_restart:2")
    assert op.data["phase"] == "stop"
    status, last = wait_done(provider, op)
    assert status.error is None and last.data["phase"] == "start"
    state = gce_fake.vm(PROJECT, ZONE, "gpu-2")
    assert (state["status"], state["boot_count"]) == ("RUNNING", 2)
    # A repeated poll of the finished stop phase (a crash before `replace` was saved) starts nothing new.
    again = provider.poll(op)
    assert again.replace is not None and again.replace.ref == last.ref
    assert gce_fake.actions("start", "gpu-2") == 1


def test_failed_operation_reports_the_provider_message(gce_fake: GceFake, gce_settings: MachineSettings) -> None:
    gce_fake.fail_operations(
        1, http_status=503, code="ZONE_RESOURCE_POOL_EXHAUSTED", message="zone is out of capacity"
    )
    provider = GCEProvider(gce_settings)
    status, _ = wait_done(provider, provider.start(vm(), VMAction.RESTART, "rem-6:vm_restart:1"))
    assert status.done
    assert status.error is not None
    assert "ZONE_RESOURCE_POOL_EXHAUSTED: zone is out of capacity" in status.error and "503" in status.error
    assert gce_fake.vm(PROJECT, ZONE, "gpu-1")["boot_count"] == 1


@pytest.mark.parametrize(
    ("status", "retry_after", "expected"),
    [(429, 7, 7.0), (503, None, None), (500, 2, 2.0)],
    ids=["429-retry-after", "503-no-hint", "500-retry-after"],
)
def test_throttling_and_outages_are_transient(
    gce_fake: GceFake, gce_settings: MachineSettings, status: int, retry_after: int | None, expected: float | None
) -> None:
    gce_fake.faults.fail_next(1, status, retry_after=retry_after)
    provider = GCEProvider(gce_settings)
    with pytest.raises(TransientError) as caught:
        provider.start(vm(), VMAction.RESTART, "rem-7:vm_restart:1")
    assert caught.value.retry_after == expected and caught.value.status == status
    # The retry (same key) goes through and acts once.
    wait_done(provider, provider.start(vm(), VMAction.RESTART, "rem-7:vm_restart:1"))
    assert gce_fake.actions("reset", "gpu-1") == 1


def test_transient_error_while_polling(gce_fake: GceFake, gce_settings: MachineSettings) -> None:
    provider = GCEProvider(gce_settings)
    op = provider.start(vm(), VMAction.RESTART, "rem-8:vm_restart:1")
    gce_fake.faults.fail_next(1, 503, match="/operations/")
    with pytest.raises(TransientError):
        provider.poll(op)
    assert wait_done(provider, op)[0].error is None


def test_missing_vm_is_not_found(gce_settings: MachineSettings) -> None:
    with pytest.raises(NotFound, match="was not found"):
        GCEProvider(gce_settings).start(vm("gone"), VMAction.RESTART, "rem-9:vm_restart:1")


def test_forbidden_is_the_systems_fault_with_the_message(gce_fake: GceFake, gce_settings: MachineSettings) -> None:
    gce_fake.faults.fail_next(1, 403, match="/reset")
    with pytest.raises(CredentialError, match="permission denied") as caught:
        GCEProvider(gce_settings).start(vm(), VMAction.RESTART, "rem-10:vm_restart:1")
    assert not isinstance(caught.value, NotFound) and caught.value.status == 403


@pytest.mark.parametrize("where", ["/reset", "/operations/"])
def test_unauthenticated_is_the_systems_fault_however_the_client_meets_it(
    gce_fake: GceFake, gce_settings: MachineSettings, where: str
) -> None:
    # On a 401 the authorized session may try to refresh its credentials first; credentials that
    # cannot refresh (anonymous here, revoked in production) then fail in google-auth, not with the
    # 401. Either way it is ours to fix: CredentialError, never an unmapped error held against the node.
    provider = GCEProvider(gce_settings)
    op = provider.start(vm(), VMAction.RESTART, "rem-12:vm_restart:1") if where != "/reset" else None
    gce_fake.faults.fail_next(3, 401, match=where)
    with pytest.raises(CredentialError) as caught:
        if op is None:
            provider.start(vm(), VMAction.RESTART, "rem-12:vm_restart:1")
        else:
            provider.poll(op)
    assert caught.value.component == "cloud"


def test_reimage_is_not_supported(gce_settings: MachineSettings) -> None:
    with pytest.raises(NotSupported, match="stop_start"):
        GCEProvider(gce_settings).start(vm(), VMAction.REIMAGE, "rem-11:vm_restart:2")


def test_unreachable_endpoint_is_transient() -> None:
    settings = MachineSettings(gce_endpoint="http://127.0.0.1:9", gce_anonymous=True, request_timeout_s=2)
    with pytest.raises(TransientError, match="cannot reach"):
        GCEProvider(settings).start(vm(), VMAction.RESTART, "rem-12:vm_restart:1")


def test_fake_wait_blocks_until_done(gce_fake: GceFake, gce_settings: MachineSettings) -> None:
    # The simulator's operations/wait (used by tools, not by the provider, which never blocks).
    from google.cloud import compute_v1

    gce_fake.op_seconds = 0.1
    provider = GCEProvider(gce_settings)
    op = provider.start(vm(), VMAction.RESTART, "rem-13:vm_restart:1")
    _, operations = provider._get_clients()
    done = operations.wait(project=PROJECT, zone=ZONE, operation=op.ref)
    assert done.status == compute_v1.Operation.Status.DONE
    assert gce_fake.vm(PROJECT, ZONE, "gpu-1")["boot_count"] == 2
