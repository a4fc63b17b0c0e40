"""The VM provider factory and the per-cloud router (no network: providers build clients lazily)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from remediation.adapters.cloud.aws import AWSProvider
from remediation.adapters.cloud.azure import AzureProvider
from remediation.adapters.cloud.gce import GCEProvider
from remediation.adapters.cloud.router import VMRouter, make_vm_provider
from remediation.adapters.factory import machine_backend, make_adapters
from remediation.adapters.memory import MemoryVM, MemoryWorld
from remediation.adapters.noop import NoopMachine
from remediation.ports.cluster import (
    MachineProvider,
    MachinesByNode,
    Operation,
    OperationStatus,
    VMAction,
    VMRef,
)
from remediation.ports.errors import NotSupported
from remediation.settings import Settings


class Recording:
    """A provider that records calls and answers in its own name."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.calls: list[tuple[str, str]] = []

    def start(self, vm: VMRef, action: VMAction, idempotency_key: str) -> Operation:
        self.calls.append(("start", vm.name))
        return Operation(self.name, f"{self.name}-op", action, vm)

    def poll(self, op: Operation) -> OperationStatus:
        self.calls.append(("poll", op.ref))
        return OperationStatus(done=True)


def test_router_dispatches_by_provider_and_builds_lazily() -> None:
    built: dict[str, Recording] = {}

    def factory(name: str):  # type: ignore[no-untyped-def]
        def build() -> Recording:
            built[name] = Recording(name)
            return built[name]

        return build

    router = VMRouter({"gce": factory("gce"), "azure": factory("azure"), "aws": factory("aws")})
    assert isinstance(router, MachineProvider)
    op = router.start(VMRef("azure", "vm-1", account="s", group="rg"), VMAction.RESTART, "k")
    assert op.provider == "azure" and set(built) == {"azure"}  # GCE and AWS never built
    assert router.poll(op).done
    router.start(VMRef("azure", "vm-2", account="s", group="rg"), VMAction.RESTART, "k2")
    assert built["azure"].calls == [("start", "vm-1"), ("poll", "azure-op"), ("start", "vm-2")]
    assert set(built) == {"azure"}


def test_router_polls_by_the_operation_provider() -> None:
    gce, aws = Recording("gce"), Recording("aws")
    router = VMRouter({"gce": lambda: gce, "aws": lambda: aws})
    router.poll(Operation("aws", "r-1", VMAction.RESTART, VMRef("aws", "i-0abc12345678")))
    assert aws.calls == [("poll", "r-1")] and gce.calls == []


def test_router_names_an_unconfigured_provider() -> None:
    router = VMRouter({"gce": lambda: Recording("gce")})
    with pytest.raises(NotSupported, match="'aws'.*configured: gce"):
        router.start(VMRef("aws", "i-0abc12345678"), VMAction.RESTART, "k")


@pytest.mark.parametrize(
    ("backend", "expected"),
    [
        ("gce", GCEProvider),
        ("azure", AzureProvider),
        ("aws", AWSProvider),
        ("auto", VMRouter),
        ("noop", NoopMachine),
        ("none", type(None)),
    ],
    ids=["gce", "azure", "aws", "auto", "noop-in-dry-run", "none"],
)
def test_factory_picks_the_backend(backend: str, expected: type) -> None:
    settings = Settings(machine={"backend": backend}, dry_run=backend == "noop")
    assert isinstance(machine_backend(settings), expected)


def test_factory_memory_uses_the_given_world() -> None:
    world = MemoryWorld(nodes=["gpu-node-0"])
    provider = machine_backend(Settings(machine={"backend": "memory"}), world=world)
    assert isinstance(provider, MemoryVM)


def test_auto_routes_memory_vms_when_a_world_is_given() -> None:
    world = MemoryWorld(nodes=["gpu-node-0"])
    router = machine_backend(Settings(), world=world)
    op = router.start(
        VMRef("memory", "gpu-node-0", provider_id="memory:///gpu-node-0"), VMAction.RESTART, "k1"
    )
    assert op.provider == "memory"
    with pytest.raises(NotSupported):
        make_vm_provider(Settings()).start(VMRef("memory", "gpu-node-0"), VMAction.RESTART, "k1")


def test_auto_sends_the_nodes_a_redfish_inventory_lists_to_their_bmcs(tmp_path: Path) -> None:
    inventory, logins = tmp_path / "inventory.yaml", tmp_path / "logins.yaml"
    inventory.write_text('bm-hgx-3: {bmc: "https://10.1.0.3", system: "3"}\n')
    logins.write_text("default: {username: remediation, password: secret}\n")
    settings = Settings(redfish={"inventory_file": str(inventory), "credentials_file": str(logins)})
    router = machine_backend(settings, intents=NoIntents())
    assert isinstance(router, MachinesByNode)
    bare = router.machine_of("gpu-node-3", "bm-hgx-3")
    assert bare is not None and (bare.provider, bare.provider_id) == ("redfish", "https://10.1.0.3/redfish/v1/Systems/3")
    assert router.machine_of("gpu-node-4", "gke-a3-pool-4") is None  # a cloud VM: its providerID names it
    assert not isinstance(machine_backend(Settings()), MachinesByNode)  # without an inventory: providerIDs only


class NoIntents:
    def recorded(self, key: str) -> dict[str, Any] | None:
        return None

    def claim(self, key: str, op: dict[str, Any]) -> dict[str, Any] | None:
        return None

    def settle(self, key: str, op: dict[str, Any]) -> None: ...
    def release(self, key: str, op: dict[str, Any]) -> None: ...


def test_the_dry_run_twin_finds_bare_metal_machines_as_the_router_does(tmp_path: Path) -> None:
    """Under dry-run a listed node's machine is still its BMC (no providerID to parse), and is recorded."""
    inventory, logins = tmp_path / "inventory.yaml", tmp_path / "logins.yaml"
    inventory.write_text('bm-hgx-3: {bmc: "https://10.1.0.3", system: "3"}\n')
    logins.write_text("default: {username: remediation, password: secret}\n")
    settings = Settings(dry_run=True, slurm={"backend": "memory"}, kube={"backend": "memory"},
                        redfish={"inventory_file": str(inventory), "credentials_file": str(logins)})
    twin = make_adapters(settings, MemoryWorld(nodes=["bm-hgx-3"]), intents=NoIntents()).machine  # type: ignore[arg-type]
    assert isinstance(twin, MachinesByNode)
    ref = twin.machine_of("bm-hgx-3")
    assert ref is not None and ref.provider == "redfish"
    assert twin.machine_of("gpu-node-4", "gke-a3-pool-4") is None
    op = twin.start(ref, VMAction.RESTART, "r1:vm_restart:1")
    assert op.ref.startswith("dry-run:") and twin.poll(op).done
