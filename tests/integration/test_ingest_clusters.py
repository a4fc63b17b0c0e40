"""Each cluster's events are recorded by its own ingest, in parallel, on real Redis, Postgres and a real
worker process: while one cluster's ingest is held up (here: a row it must write is locked, as a storm's
long batch would hold it), another cluster's fault is still recorded and its remediation opened.

Beat is off, so no safety-net ingest reads what the relay's kicks did not.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
import redis
import yaml
from sqlalchemy import Engine, func, select, text
from sqlalchemy.orm import Session

from remediation.adapters.bus import RedisEventBus
from remediation.db.models import Event, Node, Remediation
from remediation.domain.events import EventKind, NodeEvent, Source
from remediation.domain.statemachine import NodeStatus
from tests.conftest import REDIS_URL
from tests.integration.workerproc import Worker, running, wait_for, worker_env

CLUSTERS = ("west", "east")


@pytest.fixture
def worker(pg_url: str, redis_prefix: str, tmp_path: Path) -> Iterator[Worker]:
    """One worker process (two pool processes, no beat) serving both clusters, each with its own world."""
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"clusters": [
        {"name": name, "slurm": {"backend": "memory"}, "kube": {"backend": "memory"},
         "machine": {"backend": "memory"},
         "memory": {"journal": str(tmp_path / f"{name}.json"), "nodes": "gpu-node-[0-7]"}}
        for name in CLUSTERS]}))  # fmt: skip
    env = worker_env(pg_url, REDIS_URL, redis_prefix, tmp_path, REMEDIATION_CONFIG=str(config))
    with running(env, tmp_path, beat=False) as proc:
        yield proc


def fault(cluster: str, node: str) -> NodeEvent:
    return NodeEvent(source=Source.SLURM, cluster=cluster, node=node, kind=EventKind.UNHEALTHY, state="DOWN",
                     reason="not responding", observed_at=datetime.now(UTC))


def recorded(db: Engine, cluster: str) -> int:
    with Session(db) as s:
        return int(s.scalar(select(func.count()).select_from(Event).where(Event.cluster == cluster)) or 0)


def opened(db: Engine, cluster: str) -> list[str]:
    with Session(db) as s:
        return list(s.scalars(select(Remediation.node).where(Remediation.cluster == cluster)))


def lock_waits(db: Engine) -> int:
    """Sessions of this database waiting on a lock another holds."""
    with db.connect() as conn:
        return int(conn.scalar(text("select count(*) from pg_stat_activity where datname = current_database() "
                                    "and wait_event_type = 'Lock'")) or 0)


def test_a_clusters_fault_is_recorded_while_another_clusters_ingest_is_held_up(
        worker: Worker, db: Engine, redis_client: redis.Redis, redis_prefix: str) -> None:
    now = datetime.now(UTC)
    with Session(db) as holder:  # an open transaction holding west's gpu-node-1 row, uncommitted
        holder.add(Node(cluster="west", name="gpu-node-1", status=NodeStatus.HEALTHY, first_seen_at=now,
                        updated_at=now))
        holder.flush()
        RedisEventBus(redis_client, redis_prefix, cluster="west").publish([fault("west", "gpu-node-1")])
        # Barrier: west's ingest read the event and waits on the row.
        wait_for(lambda: lock_waits(db) >= 1, 30, "west's ingest to wait on the locked row", worker)
        RedisEventBus(redis_client, redis_prefix, cluster="east").publish([fault("east", "gpu-node-1")])
        wait_for(lambda: opened(db, "east") == ["gpu-node-1"], 30, "east's remediation, beside west's held ingest",
                 worker)
        assert recorded(db, "west") == 0 and lock_waits(db) >= 1  # west's ingest is still held
        holder.rollback()
    wait_for(lambda: opened(db, "west") == ["gpu-node-1"], 30, "west's remediation once the row is free", worker)
    assert recorded(db, "west") == 1 and recorded(db, "east") == 1
