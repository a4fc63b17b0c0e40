"""Choose the VM provider from ``machine.backend``: one cloud, or ``auto``, whose :class:`VMRouter` sends
each call to the cloud a Node's providerID names (an :class:`InventoryRouter` when
``redfish.inventory_file`` lists bare-metal nodes). ``memory`` and ``noop`` are built by
:mod:`remediation.adapters.factory`. Each provider is built on first use.

Why: docs/clouds.md#choosing-the-machine-provider
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from functools import partial
from typing import Protocol

from remediation.ports.cluster import (
    HardwareIdentity,
    MachineIdentity,
    MachineProvider,
    Operation,
    OperationStatus,
    VMAction,
    VMRef,
)
from remediation.ports.errors import NotSupported
from remediation.settings import MachineSettings, Settings

ProviderFactory = Callable[[], MachineProvider]


class VMRouter:
    """A MachineProvider that delegates to one provider per cloud, each built lazily by its factory."""

    def __init__(self, factories: Mapping[str, ProviderFactory]) -> None:
        self._factories = dict(factories)
        self._providers: dict[str, MachineProvider] = {}
        self._lock = threading.Lock()

    def _provider(self, name: str) -> MachineProvider:
        with self._lock:
            if name not in self._providers:
                factory = self._factories.get(name)
                if factory is None:
                    raise NotSupported(
                        f"no VM provider for {name!r} VMs (configured: {', '.join(sorted(self._factories))})"
                    )
                self._providers[name] = factory()
            return self._providers[name]

    def start(self, vm: VMRef, action: VMAction, idempotency_key: str) -> Operation:
        return self._provider(vm.provider).start(vm, action, idempotency_key)

    def poll(self, op: Operation) -> OperationStatus:
        return self._provider(op.provider).poll(op)

    def identify(self, vm: VMRef) -> HardwareIdentity:
        """The machine's identity from its cloud's provider; one that cannot say gives its name only."""
        provider = self._provider(vm.provider)
        if isinstance(provider, MachineIdentity):
            return provider.identify(vm)
        return HardwareIdentity(vm.provider, instance_id=vm.name)


class BareMetal(MachineProvider, Protocol):
    """A provider that finds machines by node and knows which nodes are its own (``redfish``)."""

    def lists(self, node: str) -> bool: ...
    def machine_of(self, node: str, k8s_node: str | None = None) -> VMRef: ...


class InventoryRouter(VMRouter):
    """``auto`` beside a bare-metal inventory: a node ``bare_metal`` lists is its machine (a
    :class:`remediation.ports.cluster.MachinesByNode`), any other is named by its Node's providerID."""

    def __init__(self, factories: Mapping[str, ProviderFactory], name: str, bare_metal: BareMetal) -> None:
        super().__init__({**factories, name: lambda: bare_metal})
        self._bare_metal = bare_metal

    def machine_of(self, node: str, k8s_node: str | None = None) -> VMRef | None:
        if not self._bare_metal.lists(k8s_node or node):  # listed by its Kubernetes Node's name, if any
            return None
        return self._bare_metal.machine_of(node, k8s_node)


def _gce(settings: MachineSettings) -> MachineProvider:
    from remediation.adapters.cloud.gce import GCEProvider

    return GCEProvider(settings)


def _azure(settings: MachineSettings) -> MachineProvider:
    from remediation.adapters.cloud.azure import AzureProvider

    return AzureProvider(settings)


def _aws(settings: MachineSettings) -> MachineProvider:
    from remediation.adapters.cloud.aws import AWSProvider

    return AWSProvider(settings)


_CLOUDS: dict[str, Callable[[MachineSettings], MachineProvider]] = {"gce": _gce, "azure": _azure, "aws": _aws}


def make_vm_provider(settings: Settings, extra: Mapping[str, ProviderFactory] | None = None,
                     bare_metal: BareMetal | None = None) -> MachineProvider:
    """The real MachineProvider ``settings.machine.backend`` names; ``extra`` adds routes to ``auto`` (the factory
    routes the simulated cluster's ``memory:///`` VMs this way), ``bare_metal`` the nodes it lists."""
    vm = settings.machine
    if vm.backend == "auto":
        factories: dict[str, ProviderFactory] = {name: partial(build, vm) for name, build in _CLOUDS.items()}
        factories.update(extra or {})
        return VMRouter(factories) if bare_metal is None else InventoryRouter(factories, "redfish", bare_metal)
    if vm.backend not in _CLOUDS:
        raise ValueError(f"{vm.backend!r} is not a real VM backend (see remediation.adapters.factory)")
    return _CLOUDS[vm.backend](vm)
