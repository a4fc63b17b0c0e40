"""Slurm's own reboot as the machine action: ``scontrol reboot ASAP nextstate=DOWN reason=... NODE``.

The machine is the Slurm node itself, ``VMRef("slurm", NODE)``. The reason's marker names the attempt, so
a redelivered ``start`` never asks twice. ``poll`` proves the reboot from slurmctld's flags and boot
times, never a timer. A rung heavier than restart raises :class:`RebootOnly`. Always through scontrol,
whatever ``slurm.backend`` reads with.

Why: docs/slurm-releases.md#slurm-reboot
"""

from __future__ import annotations

import re
import time
from typing import Any

from remediation.adapters.cloud.common import marker_for, marker_value
from remediation.adapters.slurm.args import check_node_name
from remediation.adapters.slurm.cli import CliSlurm
from remediation.adapters.slurm.parse import NodeRecord
from remediation.clock import SystemClock
from remediation.domain.policy import Clock
from remediation.ports.cluster import Operation, OperationStatus, VMAction, VMRef
from remediation.ports.errors import PermanentError, TransientError
from remediation.settings import SlurmSettings

#: The flags slurmctld shows while a reboot is pending: asked for, then handed to the node's slurmd.
REBOOT_FLAGS = frozenset({"REBOOT_REQUESTED", "REBOOT_ISSUED"})
#: BootTime is slurmctld's clock less the uptime slurmd reports, so one boot reads up to a second
#: apart from one registration to the next.
BOOT_SLACK_S = 1


class RebootOnly(PermanentError):
    """A ladder rung asks Slurm for more than a reboot."""


def slurm_machine(node: str) -> VMRef:
    """The machine of Slurm node ``node``, as the Slurm reboot (and its dry-run twin) act on it."""
    return VMRef("slurm", check_node_name(node))


def requested_at(reason: str, marker: str) -> int | None:
    """The request time our ``marker`` carries in a node's ``reason``; None when it is not there."""
    found = re.search(re.escape(marker) + r"@([0-9]{1,12})\b", reason)
    return int(found.group(1)) if found else None


class SlurmReboot:
    """:class:`remediation.ports.cluster.MachineProvider` for Slurm nodes (``machine.backend = slurm``)."""

    def __init__(self, settings: SlurmSettings, reason_prefix: str, clock: Clock | None = None) -> None:
        self.cli = CliSlurm(settings)
        self.prefix = reason_prefix
        self.clock = clock or SystemClock()  # this worker's clock

    def machine_of(self, node: str, k8s_node: str | None = None) -> VMRef:
        return slurm_machine(node)

    def start(self, vm: VMRef, action: VMAction, idempotency_key: str) -> Operation:
        name = _node(vm)
        if action != VMAction.RESTART:
            raise RebootOnly(f"Slurm can reboot {name}, nothing more: the ladder's {action} ends it here "
                             "(quarantine); give nodes Slurm reboots ladders of restart rungs")
        marker = marker_for(action, idempotency_key)
        current = self.cli.status(name)
        asked = requested_at(current.reason, marker)
        if asked is not None:  # this attempt asked already (the worker died before recording it)
            return _operation(vm, action, marker, at=stamped(current), how="found")
        if current.flags & REBOOT_FLAGS:  # a reboot is on its way already: wait on it, never add one
            since = current.reason_changed_at or current.boot_time + BOOT_SLACK_S + 1  # or a newer boot
            return _operation(vm, action, marker, at=since, how="adopted")
        now = int(self.clock.now().timestamp())  # the marker's, for people: no proof reads it
        self.cli.reboot(name, f"{self.prefix} reboot {marker_value(marker, now)}")
        return _operation(vm, action, marker, at=stamped(self.cli.status(name)), how="requested")

    def poll(self, op: Operation) -> OperationStatus:
        name = _node(op.vm)
        since = op.data.get("requested_at")
        if isinstance(since, bool) or not isinstance(since, int):
            raise PermanentError(f"the recorded reboot of {name} has no request time: {op.data!r:.200}")
        node = self.cli.status(name)
        if node.flags & REBOOT_FLAGS or not node.boot_time:
            # Pending; or no boot time at all, which slurmctld shows for a moment after a resume.
            return OperationStatus(done=False)
        if node.boot_time >= since - BOOT_SLACK_S and node.slurmd_start_time >= since:
            return OperationStatus(done=True)
        return OperationStatus(done=True, error=(
            f"slurmctld ended the reboot of {name} without one: no reboot flag left, but it booted at "
            f"{_at(node.boot_time)} (slurmd started {_at(node.slurmd_start_time)}), before the request at "
            f"{_at(since)}; ResumeTimeout passed or someone resumed it ({'+'.join(sorted(node.states))})"))


def stamped(node: NodeRecord) -> int:
    """When slurmctld took our reboot request, on its own clock: the ReasonTime it stamped on the
    reason the request set (appending " : reboot issued" or " : reboot complete" keeps it)."""
    if not node.reason_changed_at:
        raise TransientError(f"slurmctld shows no time for the reboot reason of {node.name} yet")
    return node.reason_changed_at


def _node(vm: VMRef) -> str:
    if vm.provider != "slurm":
        raise PermanentError(f"Slurm's reboot cannot act on a {vm.provider} VM ({vm.provider_id or vm.name})")
    return check_node_name(vm.name)


def _operation(vm: VMRef, action: VMAction, marker: str, *, at: int, how: str) -> Operation:
    # requested_at is slurmctld's time (stamped), as slurmctld_at says to the verify step.
    data: dict[str, Any] = {"requested_at": at, "slurmctld_at": at, "marker": marker, "request": how}
    return Operation("slurm", f"reboot:{vm.name}@{at}", action, vm, data)


def _at(stamp: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(stamp)) if stamp else "never"
