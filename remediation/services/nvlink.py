"""A node's NVLink domain as the database records each source's word for it (Slurm's block and the
Node's clique label in ``node_domains``, the GPUs' clique in the latest GPU check's sighting), with
the disagreements :func:`remediation.domain.nvlink.disagreements` finds among it and its peers;
:func:`block_health`: each block's healthy nodes against its smallest block size.

Why: docs/policy.md#the-nvlink-domain-where-it-comes-from
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime

from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session

from remediation.clock import aware
from remediation.db.models import DomainRepair, HardwareSighting, Node, NodeDomain
from remediation.domain.events import Source
from remediation.domain.nvlink import CLIQUE_LABEL, BlockHealth, Membership, disagreements, gpu_clique
from remediation.domain.statemachine import NodeStatus, Step
from remediation.domain.topology import BLOCK
from remediation.domain_repair.rules import DomainRepairStatus
from remediation.services.read_rows import NvlinkRow

_SLURM_BLOCK = (Source.SLURM.value, BLOCK)
_CLIQUE = (Source.KUBERNETES.value, CLIQUE_LABEL)


def nvlink_row(s: Session, node: str) -> NvlinkRow | None:
    """``node``'s NVLink domain in the session's cluster (None: no source names one)."""
    mine = _domains(s, [node]).get(node, {})
    block, label = mine.get(_SLURM_BLOCK), mine.get(_CLIQUE)
    peers = _peers(s, block, label) | {node}
    domains = _domains(s, peers)
    checks = _latest_checks(s, peers)
    members = {n: Membership(domains.get(n, {}).get(_SLURM_BLOCK), domains.get(n, {}).get(_CLIQUE),
                             checks[n][0] if n in checks else None) for n in peers}
    gpus, checked_at, problem = checks.get(node, (None, None, None))
    if not (block or label or gpus or problem):
        return None
    said = disagreements(node, members) + ([problem] if problem else [])
    row = NvlinkRow(block, label, gpus, aware(checked_at) if checked_at else None, said)
    row.repair = _repair(s, node)
    if block and (health := block_health(s, block)):
        (one,) = health
        row.block_size, row.block_healthy, row.partial, row.health = one.size, one.healthy, one.partial, one.text()
    return row


def block_health(s: Session, block: str | None = None) -> list[BlockHealth]:
    """Each topology/block block Slurm gave a size (or ``block`` alone), with its healthy nodes, by cluster."""
    healthy = func.count().filter(Node.status == NodeStatus.HEALTHY)
    q = (select(NodeDomain.cluster, NodeDomain.name, func.min(NodeDomain.size), func.count(), healthy)
         .outerjoin(Node, (Node.cluster == NodeDomain.cluster) & (Node.name == NodeDomain.node))
         .where(NodeDomain.source == Source.SLURM.value, NodeDomain.kind == BLOCK, NodeDomain.size.is_not(None))
         .group_by(NodeDomain.cluster, NodeDomain.name).order_by(NodeDomain.cluster, NodeDomain.name))
    if block is not None:
        q = q.where(NodeDomain.name == block)
    return [BlockHealth(cluster, name, int(size or 0), int(nodes), int(ok)) for cluster, name, size, nodes, ok in s.execute(q)]


def _peers(s: Session, block: str | None, label: str | None) -> set[str]:
    """The nodes of ``block`` and those whose Node label names ``label``'s clique."""
    wanted = [(NodeDomain.source == source) & (NodeDomain.kind == kind) & (NodeDomain.name == name)
              for (source, kind), name in ((_SLURM_BLOCK, block), (_CLIQUE, label)) if name]
    if not wanted:
        return set()
    return set(s.scalars(select(NodeDomain.node).where(or_(*wanted))))


def _domains(s: Session, nodes: Collection[str]) -> dict[str, dict[tuple[str, str], str]]:
    out: dict[str, dict[tuple[str, str], str]] = {}
    rows = s.execute(select(NodeDomain.node, NodeDomain.source, NodeDomain.kind, NodeDomain.name).where(
        NodeDomain.node.in_(list(nodes)), NodeDomain.kind.in_([BLOCK, CLIQUE_LABEL])))
    for node, source, kind, name in rows:
        out.setdefault(node, {})[(source, kind)] = name
    return out


def _latest_checks(s: Session, nodes: Collection[str]) -> dict[str, tuple[str | None, datetime | None, str | None]]:
    """Per node, from its latest GPU check that named GPUs: (their clique, when, why none)."""
    out: dict[str, tuple[str | None, datetime | None, str | None]] = {}
    rows = s.execute(select(HardwareSighting.node, HardwareSighting.at, HardwareSighting.gpus).where(
        HardwareSighting.node.in_(list(nodes)), HardwareSighting.step == Step.VALIDATE,
        HardwareSighting.dry_run.is_(False)).order_by(HardwareSighting.at.desc()))
    for node, at, gpus in rows:
        if node not in out and gpus:
            clique, problem = gpu_clique(g.get("clique") for g in gpus)
            out[node] = (clique, at, problem)
    return out


def _repair(s: Session, node: str) -> str | None:
    """The latest repair of ``node``'s domain that counted it among its trays, in words (None: none)."""
    for rep in s.scalars(select(DomainRepair).order_by(DomainRepair.id.desc()).limit(50)):
        if node in rep.trays:
            where = f"at {rep.step.value}" if rep.status is DomainRepairStatus.RUNNING else rep.status.value
            return (f"#{rep.id} ({rep.kind} {rep.name}, {rep.fault_class}) {where}: see `remediation domains show "
                    f"{rep.id}`")
    return None
