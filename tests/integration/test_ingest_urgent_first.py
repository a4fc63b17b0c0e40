"""A batch that mixes a few faults with much noise records the faults first, in a transaction of their
own, on real Redis, Postgres and a worker process: each fault's remediation is opened (and its isolation
queued) before any noise event is written, a node's events stay together and in order, and the noise
(application-level XIDs) opens nothing.

Beat is off, so the batch is read by the one ingest the publisher's kick sends.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import redis
from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session

from remediation.adapters.bus import RedisEventBus
from remediation.db.models import Event, Remediation
from remediation.domain.events import EventKind, NodeEvent, Source
from remediation.domain.policy import DecisionKind
from tests.conftest import REDIS_URL
from tests.integration.workerproc import Worker, running, wait_for, worker_env

NOISE = [f"gpu-node-{i}" for i in range(10, 130)]
FAULTS = ["gpu-node-1", "gpu-node-2", "gpu-node-3"]
BOTH = "gpu-node-3"  # an application XID first, then the fault: both go first, in that order


@pytest.fixture
def worker(pg_url: str, redis_prefix: str, tmp_path: Path) -> Iterator[Worker]:
    env = worker_env(pg_url, REDIS_URL, redis_prefix, tmp_path, REMEDIATION_MEMORY__NODES="gpu-node-[0-129]")
    with running(env, tmp_path, beat=False) as proc:
        yield proc


def app_xid(node: str, at: datetime) -> NodeEvent:
    return NodeEvent(source=Source.KUBERNETES, node=node, kind=EventKind.UNHEALTHY, state="GpuXidError=True",
                     reason=f"Node {node}: GpuXid: NVRM: Xid (PCI:0000:3b:00): 13, pid=7, Graphics SM Warp Exception",
                     observed_at=at)  # fmt: skip


def fault(node: str, at: datetime) -> NodeEvent:
    return NodeEvent(source=Source.SLURM, node=node, kind=EventKind.UNHEALTHY, state="IDLE+FAIL",
                     reason="xid 79: GPU has fallen off the bus", observed_at=at)  # fmt: skip


def batch(now: datetime) -> list[NodeEvent]:
    """The noise, with the faults late in it (a batch recorded whole would write all the noise first)."""
    events = [app_xid(n, now - timedelta(seconds=2)) for n in NOISE]
    events.insert(len(events) // 2, app_xid(BOTH, now - timedelta(seconds=1)))
    events += [fault(n, now) for n in FAULTS]
    return events


def test_faults_are_recorded_and_opened_before_the_noise_beside_them(
        worker: Worker, db: Engine, redis_client: redis.Redis, redis_prefix: str) -> None:
    RedisEventBus(redis_client, redis_prefix).publish(batch(datetime.now(UTC)))
    expected = len(NOISE) + len(FAULTS) + 1

    def recorded() -> int:
        with Session(db) as s:
            return int(s.scalar(select(func.count()).select_from(Event)) or 0)

    wait_for(lambda: recorded() >= expected, 60, "the whole batch to be recorded", worker)
    with Session(db) as s:
        opened = dict(s.execute(select(Remediation.node, Remediation.opened_at)).all())
        noise_at = s.scalar(select(func.min(Event.received_at)).where(Event.node.in_(NOISE)))
        both = s.execute(select(Event.kind, Event.decision, Event.received_at, Event.id)
                         .where(Event.node == BOTH).order_by(Event.observed_at)).all()  # fmt: skip
        noise = s.execute(select(Event.decision, func.count()).where(Event.node.in_(NOISE))
                          .group_by(Event.decision)).all()  # fmt: skip
    assert sorted(opened) == FAULTS  # the noise opens nothing
    assert noise_at is not None and max(opened.values()) < noise_at  # opened in a commit before the noise
    assert noise == [(DecisionKind.APP_XID.value, len(NOISE))]
    # The node with both: its application XID went with its fault, decided first, in the same commit.
    assert [d for _, d, _, _ in both] == [DecisionKind.APP_XID.value, DecisionKind.OPEN.value]
    assert both[0][2] == both[1][2] and both[0][3] < both[1][3]
