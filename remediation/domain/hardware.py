"""Hardware identity: which machine and which GPUs a node name stood on, and when that changed.

Each read of a machine's identity (:class:`remediation.ports.cluster.HardwareIdentity`) or of the GPUs
a check named is a *sighting*; this module turns a node's sightings into *eras*, stretches of one name
on one piece of hardware. A sighting that contradicts the era, or a completed move on a provider that
exposes no host, starts a new one. Pure: :func:`read_identity` calls the machine port only through the
step's adapters.

Why: docs/on-call.md#is-the-fleet-getting-better
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from datetime import datetime
from functools import cached_property

from remediation.domain.outcomes import Adapters, StepInput
from remediation.domain.providerid import parse_provider_id
from remediation.domain.step_records import Identity
from remediation.ports.cluster import MachineIdentity, MachinesByNode, VMAction, VMRef
from remediation.ports.errors import PermanentError, RemediationError
from remediation.vocabulary import DEFAULT_CLUSTER

#: Actions after which the machine runs on another host (GCE: a stop releases the host; Azure: redeploy).
MOVES = frozenset({VMAction.STOP_START.value, VMAction.REDEPLOY.value})
#: The fields that name the machine; two sightings that both set one and disagree are two machines.
MACHINE_FIELDS = ("instance_id", "host", "bmc_uuid", "bmc_serial")

_QUERY_LINE = re.compile(r"^\s*(?:\d+\s*,\s*)?(GPU-[0-9a-fA-F-]{8,})\s*,\s*([^,\s]+)")
_Q_UUID = re.compile(r"^\s*GPU UUID\s*:\s*(GPU-[0-9a-fA-F-]+)\s*$")
_Q_SERIAL = re.compile(r"^\s*Serial Number\s*:\s*(\S+)\s*$")
_Q_FIELD = re.compile(r"^(\s*)([A-Za-z][A-Za-z ]*?)\s*(?::\s*(.*?))?\s*$")
#: A Fabric section's keys, as nvidia-smi spells them, by what they say.
_FABRIC = {"clusteruuid": "cluster", "cliqueid": "clique", "state": "state", "status": "status"}
#: The ClusterUUID of a GPU that is in no NVLink domain (not registered with the fabric, or no fabric).
_NO_CLUSTER = "00000000-0000-0000-0000-000000000000"


@dataclass(frozen=True)
class Gpu:
    uuid: str
    serial: str | None = None
    #: The NVLink domain the GPU registered in, ``<ClusterUUID>.<CliqueId>`` as GPU Feature Discovery
    #: spells its ``nvidia.com/gpu.clique`` label (None: nvidia-smi named none, or the GPU's fabric
    #: registration is not complete).
    clique: str | None = None


def parse_gpus(output: str) -> tuple[Gpu, ...]:
    """The GPUs a check's output names: ``nvidia-smi -q`` blocks (a ``Serial Number`` line, then the
    ``GPU UUID`` line of the same GPU, then its ``Fabric`` section's ``ClusterUUID`` and ``CliqueId``)
    or ``nvidia-smi --query-gpu=[index,]uuid,serial --format=csv`` rows. A serial nvidia-smi reports
    as N/A is kept as None. Sorted by UUID, each once."""
    found: dict[str, Gpu] = {}
    serial: str | None = None
    current: str | None = None  # the -q block's GPU, once its UUID line is read
    fabric: dict[str, str] | None = None  # inside that GPU's Fabric section: what it said so far
    fabric_indent = 0
    for line in output.splitlines():
        field = _Q_FIELD.match(line)
        indent = len(field[1]) if field else 0
        if fabric is not None and (field is None or indent <= fabric_indent):
            _registered(found, current, fabric)
            fabric = None
        if m := _QUERY_LINE.match(line):
            found[m[1]] = Gpu(m[1], _known(m[2]))
        elif m := _Q_SERIAL.match(line):
            serial = _known(m[1])
        elif m := _Q_UUID.match(line):
            found[m[1]] = Gpu(m[1], serial)
            serial, current = None, m[1]
        elif field and field[3] is None and field[2] == "Fabric" and current is not None:
            fabric, fabric_indent = {}, indent
        elif field and fabric is not None and (key := _FABRIC.get(field[2].replace(" ", "").lower())):
            fabric.setdefault(key, (field[3] or "").strip())
    if fabric is not None:
        _registered(found, current, fabric)
    return tuple(found[k] for k in sorted(found))


def gpu_row(gpu: Gpu) -> dict[str, str | None]:
    """A GPU as a sighting's ``gpus`` list keeps it (``clique`` only when nvidia-smi named one)."""
    return {"uuid": gpu.uuid, "serial": gpu.serial, **({"clique": gpu.clique} if gpu.clique else {})}


def _registered(found: dict[str, Gpu], uuid: str | None, fabric: dict[str, str]) -> None:
    """Give GPU ``uuid`` the clique its Fabric section names, when its registration is complete."""
    cluster, clique = _known(fabric.get("cluster", "")), _known(fabric.get("clique", ""))
    done = fabric.get("state", "Completed").lower() == "completed" and \
        fabric.get("status", "Success").lower() == "success"
    if uuid is None or uuid not in found or not (cluster and clique and done) or cluster == _NO_CLUSTER:
        return
    found[uuid] = replace(found[uuid], clique=f"{cluster}.{clique}")


def _known(value: str) -> str | None:
    return None if value.strip().upper() in ("N/A", "[N/A]", "") else value.strip()


@dataclass(frozen=True, kw_only=True)
class Machine:
    """The machine fields of :class:`remediation.ports.cluster.HardwareIdentity`, as far as known."""

    provider: str | None = None
    instance_id: str | None = None
    host: str | None = None
    bmc_uuid: str | None = None
    bmc_serial: str | None = None
    sku: str | None = None


@dataclass(frozen=True)
class Sighting(Machine):
    """One read of a node's hardware (a ``hardware_sightings`` row)."""

    node: str
    at: datetime
    step: str  # vm_restart (before the action: waiting; after it: done), quarantine, validate
    action: str | None = None  # the machine action that had just completed (an after-action sighting)
    gpus: tuple[Gpu, ...] = ()
    remediation_id: int | None = None
    cluster: str = DEFAULT_CLUSTER  # the cluster of the node (``node`` may be a label naming it too)

    @cached_property
    def serials(self) -> frozenset[str]:
        return frozenset(g.serial or g.uuid for g in self.gpus)

    @cached_property
    def identities(self) -> frozenset[str]:
        return identities(self, self.serials)


@dataclass(frozen=True)
class Era(Machine):
    """One stretch of a node name on one piece of hardware."""

    node: str
    ordinal: int  # 1 for the first hardware seen under the name
    since: datetime
    until: datetime | None  # None: still current
    why: str  # how it began: "first seen", "host changed (a -> b)", "moved by stop_start (host not exposed)"
    serials: frozenset[str] = field(default_factory=frozenset)

    @property
    def key(self) -> str:
        """The hardware's name for counting: the most physical identity known, else the name and era."""
        if self.bmc_serial:
            return f"serial:{self.bmc_serial}"
        if self.bmc_uuid:
            return f"bmc:{self.bmc_uuid}"
        if self.host:
            return f"host:{self.host}"
        if self.serials:
            return "gpus:" + hashlib.sha256(",".join(sorted(self.serials)).encode()).hexdigest()[:12]
        return f"{self.node}#{self.ordinal}"


def change(era: Era, s: Sighting) -> str | None:
    """Why sighting ``s`` is other hardware than ``era`` (None: the same, as far as anyone can tell)."""
    for name in MACHINE_FIELDS:
        was, now = getattr(era, name), getattr(s, name)
        if was and now and was != now:
            return f"{name.replace('_', ' ')} changed"  # the eras' keys name both
    if era.serials and s.serials and era.serials != s.serials:
        return f"GPU serials changed ({len(era.serials - s.serials)} of {len(era.serials)} replaced)"
    if s.action in MOVES and s.host is None and s.bmc_uuid is None and s.bmc_serial is None:
        return f"moved by {s.action} (the provider exposes no host)"
    return None


_FILLED = (*MACHINE_FIELDS, "provider", "sku")  # what a later sighting of the same hardware fills in


def eras(sightings: Iterable[Sighting]) -> list[Era]:
    """A node's eras from its sightings (any order); each sighting fills in what its era lacked."""
    out: list[Era] = []
    for s in sorted(sightings, key=lambda x: x.at):
        cur = out[-1] if out else None
        why = "first seen" if cur is None else change(cur, s)
        if cur is not None and why is not None:
            out[-1] = replace(cur, until=s.at)
        if cur is None or why is not None:  # a new era, made with what its first sighting knows
            known = {n: v for n in _FILLED if (v := getattr(s, n))}
            out.append(Era(s.node, len(out) + 1, s.at, None, why or "first seen",
                           serials=s.serials if s.gpus else frozenset(), **known))
            continue
        filled = {n: v for n in _FILLED if getattr(cur, n) is None and (v := getattr(s, n))}
        if filled or (s.gpus and not cur.serials):
            out[-1] = replace(cur, serials=cur.serials or s.serials, **filled)
    return out


def era_at(node_eras: list[Era], at: datetime) -> Era | None:
    """The era in force at ``at``; before the first sighting, the first era (the hardware a fault was
    on is read when the workflow acts, after the fault)."""
    current = [e for e in node_eras if e.since <= at]
    return current[-1] if current else (node_eras[0] if node_eras else None)


def identities(m: Machine, serials: Iterable[str] = ()) -> frozenset[str]:
    """What names a piece of hardware wherever it goes: each GPU serial (``gpu:``), the BMC's serial
    (``serial:``) and UUID (``bmc:``), the cloud's physical host (``host:``). A VM's instance id is not
    one: it names the lease, not the hardware."""
    named = {f"gpu:{s}" for s in serials}
    named |= {f"{prefix}:{value}" for prefix, value in
              (("serial", m.bmc_serial), ("bmc", m.bmc_uuid), ("host", m.host)) if value}
    return frozenset(named)


def failed_elsewhere(current: Era, cluster: str, seen: Iterable[Sighting], *, last_seen: datetime) -> list[Sighting]:
    """The sightings, in clusters other than ``cluster``, of a remediation (a failure, or a quarantine)
    on hardware that ``current`` (a node's era in ``cluster``, last seen at ``last_seen``) stands on: the
    hardware failed there before it was seen here. Oldest first."""
    mine = identities(current, current.serials)
    if not mine:
        return []
    return sorted((s for s in seen if s.cluster != cluster and s.remediation_id is not None
                   and s.at <= last_seen and s.identities & mine), key=lambda s: s.at)


def shared_serials(sightings: Iterable[Sighting]) -> dict[str, list[str]]:
    """GPU serial -> the node names it was seen failing under, for serials seen under two or more.
    Only sightings of a remediation count: a GPU read during a fault's remediation was on a failing node."""
    names: dict[str, set[str]] = {}
    for s in sightings:
        if s.remediation_id is None or not s.gpus:  # no GPUs read: no serials (and none to compute)
            continue
        for serial in s.serials:
            names.setdefault(serial, set()).add(s.node)
    return {serial: sorted(n) for serial, n in sorted(names.items()) if len(n) > 1}


# ------------------------------------------------------------------------------------ step helper


def machine_ref(inp: StepInput, ad: Adapters) -> VMRef | None:
    """The machine the node's actions act on: the backend's own finder (bare metal), else the Node's
    providerID; None when neither names one."""
    machine = ad.machine
    vm = machine.machine_of(inp.node, inp.context.k8s_node) if isinstance(machine, MachinesByNode) else None
    if vm is None and inp.context.provider_id:
        vm = parse_provider_id(inp.context.provider_id)
    return vm


def read_identity(ad: Adapters, vm: VMRef | None, *, strict: bool = True) -> Identity:
    """The machine's identity a step records (``hardware``), or why it could not be read
    (``hardware_error``): who the hardware is never decides an action. Strict (the machine step, which
    calls the same provider next), a transient or systemic error is raised as any call's would be: the
    step is retried after the provider's Retry-After, or automation pauses, rather than calling the
    provider again at once. A permanent error about this machine is recorded; the action reports its own."""
    if vm is None or not isinstance(ad.machine, MachineIdentity):
        return Identity()
    try:
        return Identity(ad.machine.identify(vm))
    except PermanentError as exc:
        return Identity(error=exc.message[:500])
    except RemediationError as exc:
        if strict:
            raise
        return Identity(error=exc.message[:500])


def identity_now(inp: StepInput, ad: Adapters) -> Identity:
    """:func:`read_identity` of the node's machine, never raising (a quarantine does not wait on it); the
    machine may not be known (no machine backend, no providerID, a node the inventory does not list):
    then nothing is recorded."""
    try:
        vm = machine_ref(inp, ad) if ad.machine is not None else None
    except RemediationError:
        return Identity()
    return read_identity(ad, vm, strict=False)
