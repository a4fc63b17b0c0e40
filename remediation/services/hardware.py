"""Hardware sightings: written when a step ends, read back as each node's hardware eras.

:func:`record_findings` turns a recorded step outcome into sightings (a check's GPUs, a machine's
identity before and after a machine action or at a quarantine); :func:`sightings` and
:func:`node_eras` read them back; :func:`shared_gpus` finds GPU serials seen failing under two or more
node names. Dry-run sightings are recorded, marked, and never read back.

Why: docs/on-call.md#is-the-fleet-getting-better
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from remediation.clock import aware
from remediation.db.models import HardwareSighting, Remediation
from remediation.domain.hardware import Era, Gpu, Sighting, eras, shared_serials
from remediation.domain.outcomes import Outcome
from remediation.domain.statemachine import Step
from remediation.domain.step_records import MachineDetail, QuarantineDetail
from remediation.validation.service import record_validation


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
            HardwareSighting.remediation_id)  # fmt: skip


def sightings(
    s: Session, nodes: Iterable[str] | None = None, until: datetime | None = None
) -> list[Sighting]:
    """Real (not dry-run) sightings, oldest first (of ``nodes``; up to ``until``)."""
    q = select(*_COLUMNS).where(HardwareSighting.dry_run.is_(False))
    if nodes is not None:
        q = q.where(HardwareSighting.node.in_(list(nodes)))
    if until is not None:
        q = q.where(HardwareSighting.at <= until)
    return [
        Sighting(node, aware(at) or at, step, action, provider=provider, instance_id=instance, host=host,
                 bmc_uuid=bmc_uuid, bmc_serial=serial, sku=sku, remediation_id=rid,
                 gpus=tuple(Gpu(str(g.get("uuid")), g.get("serial")) for g in gpus or ()))
        for node, at, step, action, provider, instance, host, bmc_uuid, serial, sku, gpus, rid
        in s.execute(q.order_by(HardwareSighting.at, HardwareSighting.id))
    ]  # fmt: skip


def eras_by_node(rows: Iterable[Sighting]) -> dict[str, list[Era]]:
    """Each node's hardware eras, from its sightings."""
    by_node: dict[str, list[Sighting]] = {}
    for sg in rows:
        by_node.setdefault(sg.node, []).append(sg)
    return {node: eras(mine) for node, mine in sorted(by_node.items())}


def node_eras(
    s: Session, nodes: Iterable[str] | None = None, until: datetime | None = None
) -> dict[str, list[Era]]:
    """Each node's hardware eras, from its real sightings."""
    return eras_by_node(sightings(s, nodes, until))


def shared_gpus(s: Session, until: datetime | None = None) -> dict[str, list[str]]:
    """GPU serial -> node names, for every serial seen failing under two or more names."""
    return shared_serials(sightings(s, until=until))
