"""Hardware sightings: written when a step ends, read back as each node's hardware eras.

:func:`record_findings` turns a recorded step outcome into sightings (a check's GPUs, a machine's
identity before and after a machine action or at a quarantine); :func:`sightings` and
:func:`node_eras` read them back; :func:`shared_gpus` finds GPU serials seen failing under two or more
node names; :func:`hardware_flags` finds nodes whose hardware failed in another cluster (hardware follows
its identity, not a cluster). Dry-run sightings are recorded, marked, and never read back.

Why: docs/on-call.md#is-the-fleet-getting-better
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from sqlalchemy import distinct, func, select
from sqlalchemy.orm import Session

from remediation.clock import aware
from remediation.db.models import HardwareSighting, Remediation
from remediation.domain.hardware import Era, Gpu, Sighting, eras, failed_elsewhere, identities, shared_serials
from remediation.domain.outcomes import Outcome
from remediation.domain.statemachine import Step
from remediation.domain.step_records import MachineDetail, QuarantineDetail
from remediation.validation.service import record_validation
from remediation.vocabulary import node_label


def record_findings(s: Session, rem: Remediation, step: Step, *, outcome: Outcome, now: datetime,
                    actor: str) -> None:
    """Keep what a step learnt about the node's hardware (and a validate step's check), marked dry-run
    as ``rem`` is."""
    dry = bool(rem.dry_run)
    detail = getattr(outcome, "detail", None)
    if step is Step.VALIDATE:
        record_validation(s, rem, outcome, now=now, actor=actor, dry=dry)  # with the GPUs its output names
    if not isinstance(detail, MachineDetail | QuarantineDetail) or (hw := detail.identity.hardware) is None:
        return
    action = detail.after_action if isinstance(detail, MachineDetail) else None
    s.add(HardwareSighting(
        node=rem.node, at=now, remediation_id=rem.id, step=step.value, action=str(action) if action else None,
        provider=hw.provider, instance_id=hw.instance_id, host=hw.host, bmc_uuid=hw.bmc_uuid,
        bmc_serial=hw.bmc_serial, sku=hw.sku, gpus=[], dry_run=dry,
    ))  # fmt: skip


_COLUMNS = (HardwareSighting.node, HardwareSighting.at, HardwareSighting.step, HardwareSighting.action,
            HardwareSighting.provider, HardwareSighting.instance_id, HardwareSighting.host,
            HardwareSighting.bmc_uuid, HardwareSighting.bmc_serial, HardwareSighting.sku, HardwareSighting.gpus,
            HardwareSighting.remediation_id, HardwareSighting.cluster)  # fmt: skip


def sightings(
    s: Session, nodes: Iterable[str] | None = None, until: datetime | None = None,
    *, cluster: str | None = None, fleet: bool = False,
) -> list[Sighting]:
    """Real (not dry-run) sightings, oldest first (of ``nodes``; up to ``until``; of ``cluster``, else of
    every cluster the session sees). ``fleet``: name each node ``cluster/name`` (a figure over several
    clusters, where two clusters' ``gpu-node-0`` are two nodes)."""
    q = select(*_COLUMNS).where(HardwareSighting.dry_run.is_(False))
    if nodes is not None:
        q = q.where(HardwareSighting.node.in_(list(nodes)))
    if until is not None:
        q = q.where(HardwareSighting.at <= until)
    if cluster is not None:
        q = q.where(HardwareSighting.cluster == cluster)
    rows = s.execute(q.order_by(HardwareSighting.at, HardwareSighting.id))
    return [_sighting(row, fleet=fleet) for row in rows]


def _sighting(row: Any, *, fleet: bool) -> Sighting:
    node, at, step, action, provider, instance, host, bmc_uuid, serial, sku, gpus, rid, cluster = row
    return Sighting(node_label(cluster, node, fleet=fleet), aware(at) or at, step, action, provider=provider,
                    instance_id=instance, host=host, bmc_uuid=bmc_uuid, bmc_serial=serial, sku=sku,
                    remediation_id=rid, gpus=tuple(Gpu(str(g.get("uuid")), g.get("serial"), g.get("clique")) for g in gpus or ()),
                    cluster=cluster)  # fmt: skip


def eras_by_node(rows: Iterable[Sighting]) -> dict[str, list[Era]]:
    """Each node's hardware eras, from its sightings (keyed as the sightings name their node)."""
    by_node: dict[str, list[Sighting]] = {}
    for sg in rows:
        by_node.setdefault(sg.node, []).append(sg)
    return {node: eras(mine) for node, mine in sorted(by_node.items())}


def node_eras(
    s: Session, nodes: Iterable[str] | None = None, until: datetime | None = None, *, cluster: str | None = None
) -> dict[str, list[Era]]:
    """Each node's hardware eras, from its real sightings (of ``cluster`` alone, when given: two clusters
    may each have a node of that name)."""
    return eras_by_node(sightings(s, nodes, until, cluster=cluster))


def shared_gpus(s: Session, until: datetime | None = None) -> dict[str, list[str]]:
    """GPU serial -> node names, for every serial seen failing under two or more names (across clusters,
    names are ``cluster/name``)."""
    seen = sightings(s, until=until)
    fleet = len({sg.cluster for sg in seen}) > 1
    return shared_serials([replace(sg, node=node_label(sg.cluster, sg.node, fleet=fleet)) for sg in seen])


@dataclass(frozen=True)
class ForeignFailure:
    """A failure, in another cluster, of hardware a node stands on now."""

    identity: str  # what names the hardware: gpu:SERIAL, serial:BMC-SERIAL, bmc:UUID or host:HOST
    cluster: str  # where it failed
    node: str  # the name it failed under there
    remediation_id: int
    at: datetime  # when it was seen there, failing


@dataclass(frozen=True)
class HardwareFlag:
    """A node whose current hardware failed, or was quarantined, in another cluster (each failure once)."""

    cluster: str
    node: str
    failures: tuple[ForeignFailure, ...]

    @property
    def summary(self) -> str:
        """For people: which hardware failed where, e.g. ``gpu:1650... failed in west as gpu-node-1 (#3)``."""
        return "; ".join(f"{f.identity} failed in {f.cluster} as {f.node} (remediation #{f.remediation_id})"
                         for f in self.failures)


def hardware_flags(s: Session, until: datetime | None = None,
                   *, nodes: Iterable[tuple[str, str]] | None = None) -> dict[tuple[str, str], HardwareFlag]:
    """(cluster, node) -> its flag, for every node (or ``nodes``) whose current hardware failed in another
    cluster: seen during a remediation there that counts as a failure (real, not part of a correlated
    incident). Reads every cluster's sightings, whatever the session's scope: hardware moves between them."""
    real = [HardwareSighting.dry_run.is_(False)] + ([HardwareSighting.at <= until] if until is not None else [])
    many = select(func.count(distinct(HardwareSighting.cluster))).where(*real).execution_options(all_clusters=True)
    if (s.scalar(many) or 0) < 2:  # one cluster's hardware cannot have failed in another: skip the read
        return {}
    q = select(*_COLUMNS).where(*real).order_by(HardwareSighting.at, HardwareSighting.id)
    seen = [_sighting(row, fleet=False) for row in s.execute(q.execution_options(all_clusters=True))]
    wanted = set(nodes) if nodes is not None else None
    by_node: dict[tuple[str, str], list[Sighting]] = {}
    for sg in seen:
        if wanted is None or (sg.cluster, sg.node) in wanted:
            by_node.setdefault((sg.cluster, sg.node), []).append(sg)
    found = {key: (failed_elsewhere(current, key[0], seen, last_seen=mine[-1].at), identities(current, current.serials))
             for key, mine in by_node.items() for current in [eras(mine)[-1]]}
    counted = _failures(s, {sg.remediation_id for elsewhere, _ in found.values() for sg in elsewhere})
    out = {}
    for (cluster, node), (elsewhere, mark) in sorted(found.items()):
        failures = {sg.remediation_id: ForeignFailure(min(sg.identities & mark), sg.cluster, sg.node,
                                                      sg.remediation_id, sg.at)
                    for sg in reversed(elsewhere) if sg.remediation_id in counted}
        if failures:
            out[cluster, node] = HardwareFlag(cluster, node, tuple(sorted(failures.values(), key=lambda f: f.at)))
    return out


def _failures(s: Session, ids: set[int | None]) -> set[int]:
    """Those of ``ids`` that are remediations counting as failures (real, not part of an incident)."""
    wanted = sorted(i for i in ids if i is not None)
    if not wanted:
        return set()
    q = select(Remediation.id).where(Remediation.id.in_(wanted), Remediation.dry_run.is_(False),
                                     Remediation.incident_id.is_(None))
    return set(s.scalars(q.execution_options(all_clusters=True)))


def hardware_flag(s: Session, cluster: str, node: str, *, until: datetime | None = None) -> HardwareFlag | None:
    """The flag of one node for its detail page: None when its hardware never failed in another cluster."""
    return hardware_flags(s, until, nodes=[(cluster, node)]).get((cluster, node))
