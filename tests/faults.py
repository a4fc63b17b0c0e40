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
from remediation.domain import slurm_states

SOFTWARE_FAULT = "nvidia-smi hangs: driver wedged"
GPU_OFF_THE_BUS = "xid 79"
UNKNOWN_FAULT = "node misbehaving"


def show_fault(world: MemoryWorld, node: str, state: str = "FAIL", reason: str = "",
               user: str = "researcher") -> None:
    """Make the in-memory cluster show the fault a Slurm event of ``state`` reports, as Slurm shows it
    before its watcher publishes anything: slurmctld marking a node that stopped answering DOWN and
    NOT_RESPONDING, or someone's ``scontrol update state=fail|drain reason=...``. The workflow confirms
    every event against Slurm before its first action and cancels one Slurm shows healthy."""
    states = slurm_states.named(state)
    flags = set(world.node(node)["slurm"]["flags"])
    if states & {slurm_states.S.DOWN, slurm_states.S.NOT_RESPONDING}:
        world.set_slurm(node, state="DOWN", flags=sorted(flags | {"NOT_RESPONDING"}),
                        reason=reason or "Not responding", user="slurm")
    elif states & slurm_states.FAILED:
        world.set_slurm(node, flags=sorted(flags | {"FAIL"}), reason=reason, user=user)
    elif states & slurm_states.DRAINED:
        world.set_slurm(node, flags=sorted(flags | {"DRAIN"}), reason=reason, user=user)
    else:
        raise ValueError(f"no fault to show for Slurm state {state!r}")
