"""Choose the VM provider from settings, the way warehouse picks its mail backend from config.

``vm.backend``:
- ``gce`` / ``azure`` / ``aws``: that cloud only; a VM of another cloud is a permanent error.
- ``auto`` (default): a :class:`VMRouter` that sends each call to the cloud a Node's providerID names
  (``VMRef.provider`` for ``start``, ``Operation.provider`` for ``poll``). Each cloud's provider is built
  on first use, so a cluster that only runs on Azure never needs Google or AWS credentials.
- ``memory`` / ``noop``: the domain's simulated and dry-run twins, imported only when chosen. With a
  ``world`` given, ``auto`` also routes ``memory:///`` VMs (the simulated cluster) to it.

Dry-run wrapping is left to the caller that assembles all adapters (``workers.adapters.factory``), as
for the Slurm and Kubernetes factories, so that it happens exactly once.

SDK imports stay inside the builders: importing this module costs nothing, and a worker that never
touches GCE never loads google-cloud-compute.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

from remediation.errors import NotSupported
from remediation.interfaces import Operation, OperationStatus, VMAction, VMProvider, VMRef
from remediation.settings import Settings, VMSettings

ProviderFactory = Callable[[], VMProvider]


class VMRouter:
    """A VMProvider that delegates to one provider per cloud, each built lazily by its factory."""

    def __init__(self, factories: Mapping[str, ProviderFactory]) -> None:
        self._factories = dict(factories)
        self._providers: dict[str, VMProvider] = {}
        self._lock = threading.Lock()

    def _provider(self, name: str) -> VMProvider:
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


def _gce(settings: VMSettings) -> VMProvider:
    from workers.adapters.gce import GCEProvider

    return GCEProvider(settings)


def _azure(settings: VMSettings) -> VMProvider:
    from workers.adapters.azure import AzureProvider

    return AzureProvider(settings)


def _aws(settings: VMSettings) -> VMProvider:
    from workers.adapters.aws import AWSProvider

    return AWSProvider(settings)


_CLOUDS: dict[str, Callable[[VMSettings], VMProvider]] = {"gce": _gce, "azure": _azure, "aws": _aws}


def make_vm_provider(settings: Settings, *, world: Any = None, recorder: Any = None) -> VMProvider:
    """The VMProvider ``settings.vm.backend`` names."""
    vm = settings.vm
    backend = vm.backend
    if backend == "memory":
        from remediation.adapters.memory import MemoryVM

        return MemoryVM(world if world is not None else _shared_world(settings))
    if backend == "noop":
        from remediation.adapters.noop import NoopVM

        return NoopVM(recorder)
    if backend == "auto":
        factories: dict[str, ProviderFactory] = {name: partial(build, vm) for name, build in _CLOUDS.items()}
        if world is not None:
            from remediation.adapters.memory import MemoryVM

            factories["memory"] = lambda: MemoryVM(world)
        return VMRouter(factories)
    return _CLOUDS[backend](vm)


def _shared_world(settings: Settings) -> Any:
    """The process's simulated world (or the journal file named by sim.journal), shared with the
    workers and watchers of this deployment."""
    from workers.adapters.factory import make_world

    return make_world(settings)
