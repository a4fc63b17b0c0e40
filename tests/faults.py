"""Fault reasons the tests use, by what the shipped policy does with them.

The suite runs the shipped policy (tests/policies.py), which reads a fault's cause from its reason and
picks that class's ladder (``remediation/data/causes.yaml``). A test of the workflow's mechanics
(steps, crashes, retries, limits) that counts VM restarts opens its faults with :data:`SOFTWARE_FAULT`:
its class, ``software``, climbs restart, reimage, quarantine, so every rung is a VM action. A GPU that
fell off the bus (``xid 79``, :data:`GPU_OFF_THE_BUS`) is ``gpu-hardware``: the shipped ladder moves the
machine to another host at once, then quarantines. A reason the table cannot read,
:data:`UNKNOWN_FAULT`, is class ``unknown``: it climbs the site's (or the node's profile's)
``workflow.ladder``.
"""

from __future__ import annotations

from remediation.adapters.memory import MemoryWorld
from remediation.domain.events import Source
from remediation.domain.slurm_states import DRAINED, SlurmState, named

SOFTWARE_FAULT = "nvidia-smi hangs: driver wedged"
GPU_OFF_THE_BUS = "xid 79"
UNKNOWN_FAULT = "node misbehaving"

#: Slurm's base states; the rest of a state text (FAIL, DRAIN, NOT_RESPONDING, ...) are flags.
BASE_STATES = frozenset({SlurmState.IDLE, SlurmState.ALLOCATED, SlurmState.MIXED, SlurmState.COMPLETING,
                         SlurmState.DOWN})


def show_fault(world: MemoryWorld, node: str, state: str = "FAIL", reason: str = SOFTWARE_FAULT,
               source: Source = Source.SLURM, user: str | None = None) -> None:
    """Make the simulated world show the fault an event reports, as its authority would before anyone
    published it: the service confirms every event against Slurm (or the apiserver) before acting, and
    does nothing to a node that looks healthy there.

    A Slurm ``state`` (``FAIL``, ``DRAIN``, ``DOWN``, ``MIXED+FAIL``) sets its flags and base state with
    ``reason``: a researcher's ``scontrol update state=fail``, an admin's drain, or slurmctld's own
    ``DOWN``/``NOT_RESPONDING`` when the reason is "Not responding". A Kubernetes ``Type=Status``
    (``Ready=False``, ``GpuXidError=True``) sets that condition on the Node."""
    if source == Source.KUBERNETES:
        cond, _, status = state.partition("=")
        if cond == "Ready":
            world.set_k8s(node, ready=status)
        else:
            world.set_k8s(node, conditions={**world.node(node)["k8s"].get("conditions", {}), cond: status})
        return
    states = named(state)
    base = next((str(s) for s in states if s in BASE_STATES), None)
    flags = set(world.node(node)["slurm"]["flags"]) | (states - BASE_STATES)
    if base == SlurmState.DOWN and reason == "Not responding":
        flags.add(SlurmState.NOT_RESPONDING)
        user = user or "slurm"
    default_user = "admin" if flags & DRAINED else "researcher"
    world.set_slurm(node, state=base, flags=sorted(map(str, flags)), reason=reason, user=user or default_user)
