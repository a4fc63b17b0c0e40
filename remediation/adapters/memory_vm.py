"""The memory world's machines: a VM action on the simulated cluster (:mod:`remediation.adapters.memory`).

A restart completes after ``op_polls`` polls (or ``op_seconds``), gives the Node a new bootID and brings
slurmd back; a broken VM stays unhealthy unless its fault's ``fixed_by`` names the action. A used
idempotency key returns the operation it started. It shares only the world with the other memory adapters.

Why: docs/benchmarks.md#the-in-memory-world
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

from remediation.ports.cluster import HardwareIdentity, Operation, OperationStatus, VMAction, VMRef
from remediation.ports.errors import NotFound, PermanentError

if TYPE_CHECKING:
    from remediation.adapters.memory import MemoryWorld

#: What a VM action does to the hardware under it, for a fault's ``fixed_by`` (see the rehearsal's
#: outcome model): a stop/start or a redeploy lands the VM on another host.
ACTION_KIND = {"restart": "restart", "reimage": "reimage", "stop_start": "move", "redeploy": "move"}


class MemoryVM:
    def __init__(self, world: MemoryWorld) -> None:
        self.w = world

    def start(self, vm: VMRef, action: VMAction, idempotency_key: str) -> Operation:
        with self.w.mutate() as st:
            if idempotency_key in st["keys"]:
                self.w._log(st, f"vm.{action}", vm.name, effect=False, key=idempotency_key)
                return Operation.from_dict(st["ops"][st["keys"][idempotency_key]])
            node = self.w._get(st, vm.name)
            if node["vm"].get("gone"):
                raise NotFound(f"VM {vm.name} not found")
            ref = f"op-{uuid.uuid4().hex[:10]}"
            fault = node["vm"].get("fault") or {}
            data: dict[str, Any] = {"polls": 0, "category": fault.get("category"), "fabric": bool(fault.get("fabric"))}
            if self.w.clock is not None:
                data["issued_at"] = self.w.clock().isoformat()
            op = Operation("memory", ref, action, vm, data)
            st["ops"][ref] = op.to_dict()
            st["keys"][idempotency_key] = ref
            node["k8s"]["ready"] = "Unknown"
            self.w._log(st, f"vm.{action}", vm.name, effect=True, key=idempotency_key, op_ref=ref)
        self.w._pause("vm.start")
        return op

    def identify(self, vm: VMRef) -> HardwareIdentity:
        """The instance is the VM's name; its host is numbered, and a move (stop/start, redeploy) that
        completed lands it on the next."""
        with self.w.mutate() as st:
            node = self.w._get(st, vm.name)
            if node["vm"].get("gone"):
                raise NotFound(f"VM {vm.name} not found")
            host = f"{vm.name}-host{node['vm'].get('host', 0)}"
            return HardwareIdentity("memory", instance_id=f"i-{vm.name}", host=host, sku="memory-8gpu")

    def poll(self, op: Operation) -> OperationStatus:
        with self.w.mutate() as st:
            rec = st["ops"].get(op.ref)
            if rec is None:
                raise PermanentError(f"operation {op.ref} not found")
            rec["data"]["polls"] += 1
            if not self.w._op_finished(rec["data"]) or rec["data"].get("done"):
                return OperationStatus(done=bool(rec["data"].get("done")))
            rec["data"]["done"] = True
            node = st["nodes"][op.vm.name]
            if ACTION_KIND.get(str(op.action)) == "move":
                node["vm"]["host"] = node["vm"].get("host", 0) + 1  # another host, the same instance
            if node["vm"]["broken"]:
                fault = node["vm"].get("fault") or {}
                if ACTION_KIND.get(str(op.action)) not in fault.get("fixed_by", ()):
                    rec["data"]["fixed"] = False
                    return OperationStatus(done=True)  # the VM restarts but stays unhealthy
                node["vm"].update(broken=False, fault=None)  # the action this fault needed
            rec["data"]["fixed"] = True
            node["vm"]["boots"] += 1
            node["k8s"].update(ready="True", boot_id=uuid.uuid4().hex)
            if self.w.restart_clears_conditions:
                node["k8s"]["conditions"] = {c: "False" for c in node["k8s"].get("conditions", {})}
            node["jobs"] = []
            s = node["slurm"]
            s["slurmd_start"] = self.w.now_s()  # the VM booted: its slurmd started (and registered) now
            s["flags"] = [f for f in s["flags"] if f != "NOT_RESPONDING"]
            # ReturnToService=1: slurmctld returns a DOWN node to service when slurmd registers only
            # while the reason is still its own "Not responding"; our drain reason keeps it DOWN.
            if s["state"] == "DOWN" and s["reason"] in ("", "Not responding"):
                s["state"] = "IDLE"
            return OperationStatus(done=True)

