"""Two clusters in one database with the same node names, for the on-call views' tests.

``west`` and ``east`` each have a ``gpu-node-0``; ``gpu-node-1`` is only in west, ``gpu-node-2`` only
in east. West's ``gpu-node-0`` fails (an open remediation); east's stays healthy. Written the way the
watchers' events arrive: ingested on each cluster's own stream through a session scoped to it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy.orm import Session, sessionmaker

from remediation.clock import FakeClock
from remediation.db.scope import scoped
from remediation.domain.admission import Published, Publisher
from remediation.domain.events import EventKind, NodeEvent, Source
from remediation.services.ingest import ingest
from remediation.settings import Settings

WEST, EAST = "west", "east"
SHARED = "gpu-node-0"


@dataclass(frozen=True)
class Seeded:
    west_open: int  # west's gpu-node-0 remediation, left open


def _event(sessions: sessionmaker[Session], cluster: str, node: str, *, kind: EventKind, state: str,
           reason: str = "") -> list[int]:
    clock = FakeClock(datetime.now(UTC))
    event = NodeEvent(source=Source.SLURM, cluster=cluster, node=node, kind=kind, state=state, reason=reason,
                      observed_at=clock.now())
    payload = Published(event.to_json().encode(), Publisher.SLURM, cluster)
    with scoped(sessions, cluster)() as s, s.begin():
        result = ingest(s, [payload], Settings().policy, clock=clock)
    return [rid for rid, _ in result.opened]


def seed(sessions: sessionmaker[Session]) -> Seeded:
    for cluster, nodes in ((WEST, (SHARED, "gpu-node-1")), (EAST, (SHARED, "gpu-node-2"))):
        for node in nodes:
            _event(sessions, cluster, node, kind=EventKind.INVENTORY, state="IDLE")
    (opened,) = _event(sessions, WEST, SHARED, kind=EventKind.UNHEALTHY, state="FAIL", reason="xid 79")
    return Seeded(west_open=opened)
