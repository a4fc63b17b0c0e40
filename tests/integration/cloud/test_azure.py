"""AzureProvider through azure-mgmt-compute over HTTPS against the local ARM fake."""

from __future__ import annotations

import pytest

from remediation.adapters.cloud.azure import AzureProvider
from remediation.adapters.cloud.common import MARKER_TAG
from remediation.ports.cluster import Operation, VMAction, VMRef
from remediation.ports.errors import CredentialError, NotFound, PermanentError, TransientError
from remediation.settings import MachineSettings
from remediation.simulator.azure_api import AzureFake
from tests.integration.cloud.conftest import RG, SUB, StaticToken, wait_done

VM_PATH = "/virtualMachines/gpu-vm-1"


def vm(name: str = "gpu-vm-1") -> VMRef:
    pid = (
        f"azure:///subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.Compute/virtualMachines/{name}"
    )
    return VMRef("azure", name, account=SUB, group=RG, provider_id=pid)


def ss_vm(instance: str = "7") -> VMRef:
    pid = (
        f"azure:///subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.Compute"
        f"/virtualMachineScaleSets/gpu-ss/virtualMachines/{instance}"
    )
    return VMRef("azure", instance, account=SUB, group=RG, scale_set="gpu-ss", provider_id=pid)


def provider(settings: MachineSettings) -> AzureProvider:
    return AzureProvider(settings, credential=StaticToken())


def test_restart_follows_the_async_operation(azure_fake: AzureFake, azure_settings: MachineSettings) -> None:
    credential = StaticToken()
    azure = AzureProvider(azure_settings, credential=credential)
    op = azure.start(vm(), VMAction.RESTART, "rem-1:vm_restart:1")
    assert op.ref.startswith(azure_fake.url) and "/operations/" in op.ref and op.data["location"]
    status, _ = wait_done(azure, op)
    assert status.error is None
    state = azure_fake.vm(SUB, RG, "gpu-vm-1")
    assert (state["power"], state["boot_count"]) == ("running", 2)
    assert azure_fake.log.count("POST", VM_PATH + "/restart") == 1
    assert credential.calls >= 1  # the bearer policy really ran over TLS
    # The final GET on Location was made, as the SDK's own poller does.
    assert any(r.query.get("monitor") == "true" for r in azure_fake.log.items)


def test_same_key_twice_is_one_restart(azure_fake: AzureFake, azure_settings: MachineSettings) -> None:
    azure_fake.op_seconds = 0.5  # the retry comes while the restart still runs
    first = provider(azure_settings).start(vm(), VMAction.RESTART, "rem-2:vm_restart:1")
    again = provider(azure_settings).start(vm(), VMAction.RESTART, "rem-2:vm_restart:1")
    assert again.data["mode"] == "observe" and "in progress" in again.data["reason"]
    wait_done(provider(azure_settings), again)
    wait_done(provider(azure_settings), first)
    # Retried again after the restart finished (the lease expired much later): still no second restart.
    late = provider(azure_settings).start(vm(), VMAction.RESTART, "rem-2:vm_restart:1")
    assert late.data["mode"] == "observe" and "changed since" in late.data["reason"]
    assert wait_done(provider(azure_settings), late)[0].error is None
    assert azure_fake.log.count("POST", VM_PATH + "/restart") == 1
    assert azure_fake.vm(SUB, RG, "gpu-vm-1")["boot_count"] == 2
    assert azure_fake.vm(SUB, RG, "gpu-vm-1")["tags"][MARKER_TAG].startswith("restart:")


def test_marker_tag_keeps_other_tags(azure_fake: AzureFake, azure_settings: MachineSettings) -> None:
    azure = provider(azure_settings)
    azure._client(SUB).virtual_machines.begin_update(RG, "gpu-vm-1", {"tags": {"team": "ml"}}).result()
    wait_done(azure, azure.start(vm(), VMAction.RESTART, "rem-3:vm_restart:1"))
    assert azure_fake.vm(SUB, RG, "gpu-vm-1")["tags"]["team"] == "ml"
    # The next rung of the ladder has a new key, so it does act.
    wait_done(azure, azure.start(vm(), VMAction.REIMAGE, "rem-3:vm_restart:2"))
    assert azure_fake.log.count("POST", VM_PATH + "/reimage") == 1
    assert azure_fake.vm(SUB, RG, "gpu-vm-1")["boot_count"] == 3


def test_resume_polling_in_a_fresh_provider(azure_fake: AzureFake, azure_settings: MachineSettings) -> None:
    azure_fake.op_seconds = 0.3
    row = provider(azure_settings).start(vm(), VMAction.RESTART, "rem-4:vm_restart:1").to_dict()
    resumed = Operation.from_dict(row)
    assert provider(azure_settings).poll(resumed).done is False
    status, _ = wait_done(provider(azure_settings), resumed)
    assert status.error is None
    assert azure_fake.vm(SUB, RG, "gpu-vm-1")["boot_count"] == 2


@pytest.mark.parametrize("action", [VMAction.REIMAGE, VMAction.REDEPLOY], ids=["reimage", "redeploy"])
def test_heavier_actions_complete(
    azure_fake: AzureFake, azure_settings: MachineSettings, action: VMAction
) -> None:
    azure = provider(azure_settings)
    status, _ = wait_done(azure, azure.start(vm("gpu-vm-2"), action, "rem-5:vm_restart:2"))
    assert status.error is None
    assert azure_fake.log.count("POST", f"/virtualMachines/gpu-vm-2/{action}") == 1
    assert azure_fake.vm(SUB, RG, "gpu-vm-2")["boot_count"] == 2


def test_stop_start_powers_off_then_starts(azure_fake: AzureFake, azure_settings: MachineSettings) -> None:
    azure = provider(azure_settings)
    status, last = wait_done(azure, azure.start(vm("gpu-vm-2"), VMAction.STOP_START, "rem-6:vm_restart:2"))
    assert status.error is None and last.data["phase"] == "start"
    assert azure_fake.log.count("POST", "/gpu-vm-2/powerOff") == 1
    assert azure_fake.log.count("POST", "/gpu-vm-2/start") == 1
    state = azure_fake.vm(SUB, RG, "gpu-vm-2")
    assert (state["power"], state["boot_count"]) == ("running", 2)


@pytest.mark.parametrize("action", [VMAction.RESTART, VMAction.REIMAGE], ids=["restart", "reimage"])
def test_scale_set_vm(azure_fake: AzureFake, azure_settings: MachineSettings, action: VMAction) -> None:
    azure = provider(azure_settings.model_copy(update={"azure_vmss_recent_s": 0}))
    status, _ = wait_done(azure, azure.start(ss_vm(), action, "rem-7:vm_restart:1"))
    assert status.error is None
    assert azure_fake.log.count("POST", f"/virtualMachineScaleSets/gpu-ss/virtualMachines/7/{action}") == 1
    assert azure_fake.vm(SUB, RG, "7", scale_set="gpu-ss")["boot_count"] == 2


def test_scale_set_vm_same_key_twice_is_one_restart(
    azure_fake: AzureFake, azure_settings: MachineSettings
) -> None:
    # Uniform scale-set instances cannot be tagged: a recent provisioning change is the evidence.
    azure_fake.add_vm(SUB, RG, "8", scale_set="gpu-ss")
    fresh = azure_settings.model_copy(update={"azure_vmss_recent_s": 0})
    first = provider(fresh).start(ss_vm("8"), VMAction.RESTART, "rem-8:vm_restart:1")
    again = provider(azure_settings).start(ss_vm("8"), VMAction.RESTART, "rem-8:vm_restart:1")
    assert again.data["mode"] == "observe"
    wait_done(provider(azure_settings), again)
    wait_done(provider(azure_settings), first)
    after = provider(azure_settings).start(ss_vm("8"), VMAction.RESTART, "rem-8:vm_restart:1")
    assert after.data["mode"] == "observe" and "ago" in after.data["reason"]
    assert azure_fake.log.count("POST", "/gpu-ss/virtualMachines/8/restart") == 1
    assert azure_fake.vm(SUB, RG, "8", scale_set="gpu-ss")["boot_count"] == 2


def test_failed_operation_reports_the_provider_message(
    azure_fake: AzureFake, azure_settings: MachineSettings
) -> None:
    azure_fake.fail_operations(1, code="AllocationFailed", message="Allocation failed in this cluster.")
    azure = provider(azure_settings)
    status, _ = wait_done(azure, azure.start(vm(), VMAction.REDEPLOY, "rem-9:vm_restart:2"))
    assert status.done and status.error is not None
    assert "AllocationFailed: Allocation failed in this cluster." in status.error
    assert azure_fake.vm(SUB, RG, "gpu-vm-1")["boot_count"] == 1


def test_failed_operation_seen_through_observe(azure_fake: AzureFake, azure_settings: MachineSettings) -> None:
    azure_fake.fail_operations(1, code="OSProvisioningTimedOut", message="OS provisioning timed out")
    provider(azure_settings).start(vm(), VMAction.RESTART, "rem-10:vm_restart:1")
    again = provider(azure_settings).start(vm(), VMAction.RESTART, "rem-10:vm_restart:1")
    status, _ = wait_done(provider(azure_settings), again)
    assert status.error is not None and "failed/osprovisioningtimedout" in status.error.lower()


@pytest.mark.parametrize(
    ("status", "retry_after", "expected"),
    [(429, 17, 17.0), (503, None, None), (502, 3, 3.0)],
    ids=["429-retry-after", "503-no-hint", "502-retry-after"],
)
def test_throttling_and_outages_are_transient(
    azure_fake: AzureFake,
    azure_settings: MachineSettings,
    status: int,
    retry_after: int | None,
    expected: float | None,
) -> None:
    azure_fake.faults.fail_next(1, status, retry_after=retry_after, match="/restart")
    azure = provider(azure_settings)
    with pytest.raises(TransientError) as caught:
        azure.start(vm(), VMAction.RESTART, "rem-11:vm_restart:1")
    assert caught.value.retry_after == expected and caught.value.status == status
    # The marker was written before the refused POST, but the VM shows no change since: the retry acts.
    retried = azure.start(vm(), VMAction.RESTART, "rem-11:vm_restart:1")
    assert retried.data["mode"] == "lro"
    assert wait_done(azure, retried)[0].error is None
    assert azure_fake.log.count("POST", VM_PATH + "/restart", status=202) == 1
    assert azure_fake.vm(SUB, RG, "gpu-vm-1")["boot_count"] == 2


def test_throttled_read_before_acting_retries_cleanly(
    azure_fake: AzureFake, azure_settings: MachineSettings
) -> None:
    azure_fake.faults.fail_next(1, 429, retry_after=5, method="GET", match="/gpu-vm-1")
    azure = provider(azure_settings)
    with pytest.raises(TransientError) as caught:
        azure.start(vm(), VMAction.RESTART, "rem-12:vm_restart:1")
    assert caught.value.retry_after == 5.0
    wait_done(azure, azure.start(vm(), VMAction.RESTART, "rem-12:vm_restart:1"))
    assert azure_fake.log.count("POST", VM_PATH + "/restart", status=202) == 1


def test_transient_error_while_polling(azure_fake: AzureFake, azure_settings: MachineSettings) -> None:
    azure = provider(azure_settings)
    op = azure.start(vm(), VMAction.RESTART, "rem-13:vm_restart:1")
    azure_fake.faults.fail_next(1, 503, retry_after=1, match="/operations/")
    with pytest.raises(TransientError) as caught:
        azure.poll(op)
    assert caught.value.retry_after == 1.0
    assert wait_done(azure, op)[0].error is None


def test_missing_vm_is_not_found(azure_settings: MachineSettings) -> None:
    with pytest.raises(NotFound, match="ResourceNotFound|was not found"):
        provider(azure_settings).start(vm("gone"), VMAction.RESTART, "rem-14:vm_restart:1")
    with pytest.raises(NotFound):
        provider(azure_settings).start(ss_vm("99"), VMAction.RESTART, "rem-14:vm_restart:1")


def test_forbidden_is_the_systems_fault_with_the_message(azure_fake: AzureFake, azure_settings: MachineSettings) -> None:
    azure_fake.faults.fail_next(1, 403)
    with pytest.raises(CredentialError, match="permission denied") as caught:
        provider(azure_settings).start(vm(), VMAction.RESTART, "rem-15:vm_restart:1")
    assert not isinstance(caught.value, NotFound) and caught.value.status == 403


def test_poll_refuses_a_foreign_url(azure_settings: MachineSettings) -> None:
    op = Operation("azure", "https://attacker.example/op", VMAction.RESTART, vm(), {"mode": "lro"})
    with pytest.raises(PermanentError, match="refusing"):
        provider(azure_settings).poll(op)


def test_api_version_is_required(azure_fake: AzureFake, azure_settings: MachineSettings) -> None:
    client = provider(azure_settings)._client(SUB)
    from azure.core.rest import HttpRequest

    path = f"{azure_fake.url}/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.Compute/virtualMachines/gpu-vm-1"
    assert client.send_request(HttpRequest("GET", path)).status_code == 400
    lower = path.lower() + "?api-version=2026-04-01"  # ARM matches paths case-insensitively
    assert client.send_request(HttpRequest("GET", lower)).json()["name"] == "gpu-vm-1"
