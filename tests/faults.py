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

SOFTWARE_FAULT = "nvidia-smi hangs: driver wedged"
GPU_OFF_THE_BUS = "xid 79"
UNKNOWN_FAULT = "node misbehaving"
