"""Dry-run's redfish: everything the real provider (and rack power) reads, nothing it sends.

It finds the node's BMC, signs in and reads the system, so a dry run shows the reset each node would get
and surfaces a wrong inventory entry, credential or CA. It records the reset and sends none; its
operation's ref starts with ``dry-run:``, which tells the verify step nothing was restarted. The rack
power twin reads the chassis likewise and records "would power-cycle chassis ...".

Why: docs/clouds.md#bare-metal-redfish-bmcs
"""

from __future__ import annotations

from remediation.adapters.noop import Recorder
from remediation.adapters.redfish.provider import RedfishProvider
from remediation.adapters.redfish.rack import RedfishRackPower
from remediation.ports.cluster import HardwareIdentity, Operation, OperationStatus, VMAction, VMRef
from remediation.ports.rack import RackPowerState, RackReset


class NoopRedfish:
    def __init__(self, real: RedfishProvider, recorder: Recorder | None = None) -> None:
        self.real = real
        self.record = recorder or Recorder()

    def machine_of(self, node: str, k8s_node: str | None = None) -> VMRef:
        return self.real.machine_of(node, k8s_node)

    def identify(self, vm: VMRef) -> HardwareIdentity:
        return self.real.identify(vm)  # a read: the dry run records the hardware as the real one would

    def start(self, vm: VMRef, action: VMAction, idempotency_key: str) -> Operation:
        op = self.real.plan(vm, action)
        d = op.data
        self.record(
            f"{d['reset']}" + (f" then {d['then']}" if d["then"] else ""),
            node=vm.name,
            bmc=d["bmc"],
            system=d["system"],
            power=d["before"],
            key=idempotency_key,
        )
        return Operation(op.provider, f"dry-run:{idempotency_key}", action, vm, d)

    def poll(self, op: Operation) -> OperationStatus:
        return OperationStatus(done=True)


class NoopRackPower:
    """:class:`remediation.ports.rack.RackPower` for dry-run: plans from the real chassis, sends nothing."""

    def __init__(self, real: RedfishRackPower, recorder: Recorder | None = None) -> None:
        self.real = real
        self.record = recorder or Recorder()

    def knows(self, domain: str) -> bool:
        return self.real.knows(domain)

    def reset(self, domain: str, key: str) -> RackReset:
        planned = self.real.plan(domain)
        self.record(
            f"power-cycle chassis {planned.chassis}",
            domain=domain,
            bmc=planned.bmc,
            via=str(planned.via),
            resets=[f"{t.reset}" + (f" then {t.then}" if t.then else "") + f" to {t.target}"
                    for t in planned.targets],
            key=key,
        )
        return planned.with_(recorded_only=True)

    def poll(self, reset: RackReset) -> RackReset:
        return reset  # recorded only: done, and nothing to observe

    def state(self, domain: str) -> RackPowerState:
        return self.real.state(domain)
