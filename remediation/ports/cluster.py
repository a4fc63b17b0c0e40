"""The three small interfaces the workflow acts through (Slurm, Kubernetes, a machine's hammer) and the
value types they exchange.

:mod:`remediation.adapters` implements each, with a no-op (dry-run) and an in-memory twin beside every
real backend; :mod:`remediation.adapters.factory` picks one from the settings. Every implementation
keeps three contracts: writes are idempotent, errors are those of :mod:`remediation.ports.errors`, and
no call blocks for long (waiting is the workflow's job).

Why: docs/architecture.md#ports-small-interfaces-each-with-a-no-op
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any, Literal, Protocol, runtime_checkable

# --------------------------------------------------------------------------------------------- Slurm


@dataclass(frozen=True)
class SlurmNode:
    """One node as slurmctld reports it. ``state`` is the upper-case base state (IDLE, ALLOCATED,
    MIXED, DOWN, ...); ``flags`` the upper-case state flags (DRAIN, FAIL, NOT_RESPONDING, ...)."""

    name: str
    state: str
    flags: frozenset[str] = frozenset()
    reason: str = ""
    reason_user: str | None = None
    reason_time: datetime | None = None
    slurmd_start_time: datetime | None = None  # when the node's slurmd last started (it registers then)
    partitions: tuple[str, ...] = ()  # what a profile selects on
    features: tuple[str, ...] = ()

    @property
    def states(self) -> frozenset[str]:
        """Base state and flags together, e.g. {"IDLE", "DRAIN"}."""
        return self.flags | {self.state}

    def reason_is_ours(self, prefix: str) -> bool:
        return self.reason.startswith(prefix)


@runtime_checkable
class SlurmControl(Protocol):
    def list_nodes(self) -> list[SlurmNode]:
        """Every node slurmctld knows."""
        ...

    def get_node(self, name: str) -> SlurmNode:
        """One node; raises UnknownNode."""
        ...

    def running_jobs(self, name: str) -> int:
        """Number of jobs running (or completing) on the node."""
        ...

    def jobs_on(self, name: str) -> list[str]:
        """Ids of the jobs that still hold the node (running, completing, configuring, suspended),
        as ``squeue -w NAME`` lists them; sorted."""
        ...

    def requeue_jobs(self, job_ids: list[str]) -> None:
        """``scontrol requeue`` these jobs; a job that already ended is not an error."""
        ...

    def cancel_jobs(self, job_ids: list[str]) -> None:
        """``scancel`` these jobs; a job that already ended is not an error."""
        ...

    def signal_jobs(self, job_ids: list[str], signal: str, scope: Literal["batch", "full"]) -> None:
        """``scancel --signal=SIGNAL --batch`` (or ``--full``) these jobs: ask them to checkpoint. Not
        idempotent (a job signalled twice saves twice, or ends on a second USR1): the caller records an
        intent first. A job that already ended is not an error."""
        ...

    def drain(self, name: str, reason: str) -> None:
        """``scontrol update nodename=NAME state=drain reason=REASON``. The caller passes the full
        reason (with our prefix)."""
        ...

    def set_state(self, name: str, state: Literal["DOWN", "FAIL"], reason: str) -> None:
        """Mark the node DOWN or FAIL with a reason."""
        ...

    def resume(self, name: str) -> None:
        """Return the node to service. Ownership is checked by the caller (see slurm_ops)."""
        ...


# ---------------------------------------------------------------------------------------- Kubernetes


@dataclass(frozen=True)
class KubeNode:
    """What the workflow needs of a Kubernetes Node."""

    name: str
    ready: str  # "True", "False" or "Unknown"
    boot_id: str
    provider_id: str = ""
    unschedulable: bool = False
    cordoned_by_us: bool = False
    quarantine_tainted: bool = False
    conditions: dict[str, str] = field(default_factory=dict)  # type -> status
    messages: dict[str, str] = field(default_factory=dict)  # type -> "reason: message", as the watcher reads it

    def condition(self, cond_type: str) -> str | None:
        """The status of ``cond_type`` now (Ready included); None: not reported."""
        return self.ready if cond_type == "Ready" else self.conditions.get(cond_type)


@dataclass(frozen=True)
class EvictionProgress:
    """The result of one eviction pass over a Node's pods."""

    remaining: int  # pods that still need to leave (DaemonSet and mirror pods excluded)
    blocked: tuple[str, ...] = ()  # "namespace/name" refused by a PodDisruptionBudget this pass
    retry_after: float | None = None

    @property
    def done(self) -> bool:
        return self.remaining == 0


@runtime_checkable
class KubeNodes(Protocol):
    def node_for(self, slurm_node: str) -> str:
        """Resolve a Slurm node name to its Kubernetes Node name (mapping strategy); UnknownNode."""
        ...

    def get(self, name: str) -> KubeNode:
        ...

    def cordon(self, name: str, reason: str) -> KubeNode:
        """Mark unschedulable and annotate the cordon as ours. A Node a human already cordoned is
        left as it is (and not marked ours). Returns the Node as it stands after, so that the caller
        learns whose cordon it is without reading it again (``cordoned_by_us``)."""
        ...

    def uncordon(self, name: str) -> bool:
        """Remove the cordon only if it is ours; return whether it did."""
        ...

    def evict_pods(self, name: str) -> EvictionProgress:
        """One pass of the Eviction API over the Node's pods; never force-deletes."""
        ...

    def request_checkpoint(self, name: str, requested_at: datetime, deadline: datetime) -> list[str]:
        """Annotate the pods an eviction would remove from Node ``name`` with a checkpoint request:
        when it was asked and when eviction starts. A pod that carries one keeps it (asked once).
        Returns those pods still on the Node (``namespace/name``). No exec into any pod."""
        ...

    def set_quarantine_taint(self, name: str, on: bool) -> None:
        """Add or remove our NoSchedule quarantine taint."""
        ...


# ------------------------------------------------------------------------------------------ Machines
# What acts on the machine behind a node. The clouds act on VMs, which is where the value types take
# their names from; a hammer for another kind of machine speaks the same shape: a reference to the
# machine, an action, and an operation followed to its end.


class VMAction(StrEnum):
    RESTART = "restart"
    REIMAGE = "reimage"
    REDEPLOY = "redeploy"
    STOP_START = "stop_start"


@dataclass(frozen=True)
class VMRef:
    """A VM parsed from a Node's spec.providerID (see remediation.domain.providerid)."""

    provider: Literal["gce", "azure", "aws", "memory", "slurm", "redfish"]
    name: str  # GCE instance name, Azure VM name or scale-set instance id, AWS instance id; slurm, redfish: node
    zone: str = ""  # GCE zone, AWS availability zone
    account: str = ""  # GCE project, Azure subscription
    group: str = ""  # Azure resource group
    scale_set: str | None = None  # Azure VMSS name
    provider_id: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> VMRef:
        return cls(**data)


#: How the dry-run twin names an operation it recorded instead of issuing: nothing was started.
DRY_RUN_REF = "dry-run:"


@dataclass(frozen=True)
class Operation:
    """A started provider operation, persisted in remediation_steps before anyone waits on it."""

    provider: str
    ref: str  # GCE operation name, Azure-AsyncOperation URL, AWS request id
    action: VMAction
    vm: VMRef
    data: dict[str, Any] = field(default_factory=dict)  # provider extras (phase, zone, state...)
    # The dry-run twin recorded it instead of issuing it: nothing was started, so nothing completed and
    # nothing can be verified.
    recorded_only: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "provider": self.provider,
            "ref": self.ref,
            "action": str(self.action),
            "vm": self.vm.to_dict(),
            "data": dict(self.data),
            "recorded_only": self.recorded_only,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Operation:
        return cls(
            provider=data["provider"],
            ref=data["ref"],
            action=VMAction(data["action"]),
            vm=VMRef.from_dict(data["vm"]),
            data=dict(data.get("data") or {}),
            recorded_only=_recorded_only(data),
        )


def _recorded_only(data: dict[str, Any]) -> bool:
    """The flag as written; a row written before it was typed has only its reference, which the dry-run
    twin always named ``dry-run:...``."""
    flag = data.get("recorded_only")
    return flag if isinstance(flag, bool) else str(data.get("ref", "")).startswith(DRY_RUN_REF)


@dataclass(frozen=True)
class OperationStatus:
    done: bool
    error: str | None = None  # set when the operation finished with an error (provider's message)
    replace: Operation | None = None  # a multi-phase action moved on (e.g. stop done -> start issued)
    # The first half of a two-part action is sent and its second is not (a BMC's ForceOff before its On):
    # giving up now would leave the machine off, so the step waits past its timeout; the provider bounds
    # it (the second half is sent, or the operation ends with an error).
    midway: bool = False


@runtime_checkable
class MachineProvider(Protocol):
    """Restarts, moves or reimages a node's machine: the ladder's machine rungs."""

    def start(self, vm: VMRef, action: VMAction, idempotency_key: str) -> Operation:
        """Start an action. Calling again with the same key must not act twice."""
        ...

    def poll(self, op: Operation) -> OperationStatus:
        """Check an operation once."""
        ...


@runtime_checkable
class MachinesByNode(Protocol):
    """A MachineProvider that finds a node's machine by the node's name rather than by the Node's
    providerID: bare metal, where kubelet sets no providerID and a Slurm-only site has no Node at all
    (``redfish``: an inventory of its own; ``slurm``: the Slurm node itself). The workflow asks it for
    the ref it then starts actions on."""

    def machine_of(self, node: str, k8s_node: str | None = None) -> VMRef | None:
        """The machine of Slurm node ``node`` (on Kubernetes Node ``k8s_node``, when there is one);
        UnknownNode when the backend does not know it. None: not a machine this backend finds by node
        (``auto`` with a redfish inventory, for a node the inventory does not list): the Node's
        providerID names it."""
        ...


@dataclass(frozen=True)
class HardwareIdentity:
    """What a machine's provider says it is, read at a fault and after each action. Each field is the
    provider's own and None where it exposes none: ``instance_id`` (GCE's numeric instance id, Azure's
    vmId, AWS's instance id; a stop/start, a redeploy keep it), ``host`` (the physical host: GCE's
    ``resourceStatus.physicalHost``, AWS's ``Placement.HostId`` on a Dedicated Host; Azure's public API
    names none outside dedicated hosts), the BMC's system ``UUID`` and ``SerialNumber`` (Redfish), and
    ``sku`` (machine type, VM size, instance type, or the system's Model)."""

    provider: str
    instance_id: str | None = None
    host: str | None = None
    bmc_uuid: str | None = None
    bmc_serial: str | None = None
    sku: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@runtime_checkable
class MachineIdentity(Protocol):
    """A machine backend that can say which hardware a machine is on (one read, no action)."""

    def identify(self, vm: VMRef) -> HardwareIdentity:
        """The machine's identity now; the typed errors of remediation.ports.errors."""
        ...
