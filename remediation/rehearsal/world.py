"""The world's side of a rehearsal: what a fault does to a node, what a repair by hand undoes, and how
long each node was out of service.

None of this is the policy's business, so it is kept apart from the loop that drives the policy
(:mod:`remediation.rehearsal.loop`): the loop calls :func:`strike` when a fault is due and :func:`repair`
when a human's repair lands, and :class:`Fleet` reads the world after every simulated moment. A fault
makes its node bad in Slurm or Kubernetes; whether an action fixes it is the world's ``vm.fault`` (from
the outcome model, :mod:`remediation.rehearsal.truth`) or the mix's ``remediable_by_vm_restart`` column.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from remediation.adapters.memory import MemoryWorld
from remediation.domain.events import Source
from remediation.rehearsal.trace import Fault


def strike(world: MemoryWorld, fault: Fault) -> None:
    ev = fault.event
    with world.mutate() as st:
        node = st["nodes"].get(ev.node)
        if node is None:
            return
        if ev.source is Source.SLURM:
            s = node["slurm"]
            if ev.state_upper == "DOWN":
                s["state"], s["flags"] = "DOWN", sorted(set(s["flags"]) | {"NOT_RESPONDING"})
            elif ev.state_upper in ("FAIL", "DRAIN"):
                s["flags"] = sorted(set(s["flags"]) | {ev.state_upper})
            s["reason"], s["reason_user"] = ev.reason, ev.reason_user or "user"
        elif ev.state.startswith("Ready="):
            node["k8s"]["ready"] = ev.state.split("=", 1)[1]
        else:  # a problem condition (GpuXidError=True): the Node reports it until a restart or a repair
            cond, _, status = ev.state.partition("=")
            node["k8s"].setdefault("conditions", {})[cond] = status
        if fault.outcome is not None:
            # The outcome model decides what fixes it: the actions in fixed_by, else hands.
            o = fault.outcome
            node["vm"]["broken"] = True
            node["vm"]["fault"] = {"category": o.category, "fixed_by": sorted(o.fixed_by), "fabric": o.fabric}
        elif not fault.fixed_by_restart:
            node["vm"]["broken"] = True


def repair(world: MemoryWorld, name: str, fabric_only: bool = False) -> None:
    """The hand repair of ``name`` (``fabric_only``: the fabric's repair, which fixes a node only if
    the fabric was what it was waiting for)."""
    with world.mutate() as st:
        node = st["nodes"][name]
        fault = node["vm"].get("fault") or {}
        if fabric_only and not fault.get("fabric"):
            return
        node["vm"]["broken"] = False
        node["vm"]["fault"] = None
        node["k8s"]["ready"] = "True"
        node["k8s"]["conditions"] = {c: "False" for c in node["k8s"].get("conditions", {})}
        s = node["slurm"]
        s["flags"] = [f for f in s["flags"] if f != "NOT_RESPONDING"]
        if s["state"] == "DOWN":
            s["state"] = "IDLE"
        if s["reason"].startswith("maintenance"):  # the human who drained it for maintenance resumes it
            s["flags"] = [f for f in s["flags"] if f != "DRAIN"]
            s["reason"] = ""


OUT_FLAGS = frozenset({"DRAIN", "FAIL", "NOT_RESPONDING"})


def in_service(node: dict[str, Any]) -> bool:
    """A node a job could land on: nothing broken, not drained, failed or down, Ready and schedulable."""
    s, k = node["slurm"], node["k8s"]
    return (not node["vm"]["broken"] and s["state"] != "DOWN" and not OUT_FLAGS & set(s["flags"])
            and k["ready"] == "True" and not k["unschedulable"])


class Fleet:
    """Time out of service per node, read from the world after every simulated moment that touched it."""

    def __init__(self) -> None:
        self.out_since: dict[str, datetime] = {}
        self.hours = 0.0

    def observe(self, world: MemoryWorld, names: list[str], now: datetime) -> None:
        with world.mutate() as st:
            for name in names:
                node = st["nodes"].get(name)
                if node is None:
                    continue
                up = in_service(node)
                if not up and name not in self.out_since:
                    self.out_since[name] = now
                elif up and name in self.out_since:
                    self.hours += (now - self.out_since.pop(name)).total_seconds() / 3600

    def close(self, now: datetime) -> float:
        return self.hours + sum((now - t).total_seconds() for t in self.out_since.values()) / 3600
