"""End to end on real servers: event -> Redis stream -> real Celery worker processes -> Postgres.

The adapters are the in-memory world, kept in a journal file so that every worker process (and the
test) sees one world and one call log; that log is how "exactly once" is counted.
"""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest
import redis
from sqlalchemy import create_engine, select
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from remediation.adapters.bus import RedisEventBus
from remediation.adapters.memory import MemoryWorld
from remediation.db.models import Event, RejectedEvent, Remediation, RemediationStep
from remediation.domain.events import EventKind, NodeEvent, Source
from remediation.settings import load_settings
from remediation.workers.celery_app import make_app
from tests.conftest import REDIS_URL
from tests.faults import SOFTWARE_FAULT, show_fault
from tests.integration.workerproc import ROOT, Worker, wait_for, worker_env


@pytest.fixture
def env(pg_url: str, redis_prefix: str, tmp_path: Path) -> dict[str, str]:
    return worker_env(pg_url, REDIS_URL, redis_prefix, tmp_path)


@pytest.fixture
def bus(env: dict[str, str], redis_client: redis.Redis, redis_prefix: str) -> RedisEventBus:
    settings = load_settings(broker={"redis_url": REDIS_URL, "key_prefix": redis_prefix})
    app = make_app(settings)
    return RedisEventBus(
        redis_client, redis_prefix, kick=lambda: app.send_task("remediation.ingest", queue="ingest")
    )


@pytest.fixture
def db(pg_url: str):  # noqa: ANN201
    engine = create_engine(pg_url, poolclass=NullPool)
    yield engine
    engine.dispose()


def fail_event(node: str, reason: str = SOFTWARE_FAULT, world: MemoryWorld | None = None) -> NodeEvent:
    """The Slurm watcher's event for a node failed with ``reason``; with ``world``, the world (the workers'
    journal) shows the failure first, as Slurm would when the watcher saw it."""
    if world is not None:
        show_fault(world, node, "FAIL", reason)
    return NodeEvent(
        source=Source.SLURM,
        node=node,
        kind=EventKind.UNHEALTHY,
        state="FAIL",
        reason=reason,
        observed_at=datetime.now(UTC),
    )


def remediation_status(db, node: str) -> str | None:  # noqa: ANN001
    with Session(db) as s:
        return s.scalars(select(Remediation.status).where(Remediation.node == node)).first()


def test_event_goes_through_every_step_in_a_real_worker(env, bus, db, tmp_path) -> None:  # noqa: ANN001
    world = MemoryWorld(nodes=["gpu-node-0"], journal=tmp_path / "world.json")
    worker = Worker(env, tmp_path)
    try:
        bus.publish([fail_event("gpu-node-0", world=world)])
        wait_for(lambda: remediation_status(db, "gpu-node-0") == "succeeded", 60, "the remediation", worker)
    finally:
        worker.stop()
    with Session(db) as s:
        rem = s.scalars(select(Remediation)).one()
        rows = s.scalars(select(RemediationStep).order_by(RemediationStep.id)).all()
        event = s.scalars(select(Event)).one()
    assert [r.step for r in rows] == [
        "slurm_drain",
        "k8s_cordon",
        "k8s_evict",
        "vm_restart",
        "verify",
        "return",
    ]
    assert [r.idempotency_key for r in rows] == [f"r{rem.id}:{r.step}:1" for r in rows]
    assert all(r.status == "done" and r.started_at <= r.finished_at for r in rows)
    assert event.decision == "open" and event.remediation_id == rem.id
    # One sequence: the return step lifts the cordon it placed (ours), then resumes our drain.
    assert [c["op"] for c in world.calls(effect=True)] == [
        "slurm.drain",
        "k8s.cordon",
        "vm.restart",
        "k8s.uncordon",
        "slurm.resume",
    ]


@pytest.mark.parametrize(
    "step", ["vm.start", "k8s.cordon", "slurm.drain"], ids=["vm_restart", "k8s_cordon", "slurm_drain"]
)
def test_sigkill_mid_step_resumes_with_each_action_exactly_once(env, bus, db, tmp_path, step) -> None:  # noqa: ANN001
    env = {**env, "REMEDIATION_MEMORY__CALL_DELAY_S": f'{{"{step}": 30}}'}
    world = MemoryWorld(nodes=["gpu-node-1"], journal=tmp_path / "world.json")
    op = {"vm.start": "vm.restart", "k8s.cordon": "k8s.cordon", "slurm.drain": "slurm.drain"}[step]
    first = Worker(env, tmp_path)
    try:
        bus.publish([fail_event("gpu-node-1", world=world)])
        wait_for(lambda: world.calls(op, effect=True), 60, f"{op} to be called", first)
    finally:
        first.kill()  # inside the step: the effect happened, its result was never recorded
    with Session(db) as s:
        row = s.scalars(
            select(RemediationStep).where(
                RemediationStep.step
                == op.replace("vm.restart", "vm_restart")
                .replace("k8s.cordon", "k8s_cordon")
                .replace("slurm.drain", "slurm_drain")
            )
        ).one()
        # A machine action's row already waits: slurmd's start was recorded in a write of its own first.
        assert row.status == ("waiting" if op == "vm.restart" else "started") and row.finished_at is None
    env2 = {**env, "REMEDIATION_MEMORY__CALL_DELAY_S": "{}"}
    second = Worker(env2, tmp_path)
    try:
        wait_for(
            lambda: remediation_status(db, "gpu-node-1") == "succeeded",
            90,
            "the new worker to finish",
            second,
        )
    finally:
        second.stop()
    effective = [c["op"] for c in world.calls(effect=True)]
    for action in ("slurm.drain", "k8s.cordon", "vm.restart", "slurm.resume"):
        assert effective.count(action) == 1, effective
    with Session(db) as s:
        assert (
            s.scalars(select(RemediationStep).where(RemediationStep.status.in_(("started", "waiting")))).all()
            == []
        )


def test_malformed_payload_is_kept_and_the_rest_processed(env, bus, db, tmp_path) -> None:  # noqa: ANN001
    world = MemoryWorld(nodes=["gpu-node-2"], journal=tmp_path / "world.json")
    worker = Worker(env, tmp_path)
    try:
        bus.publish_raw('{"source": "slurm", "node": "gpu-node-2", "kind": "exploded"}')
        bus.publish([fail_event("gpu-node-2", world=world)])
        wait_for(lambda: remediation_status(db, "gpu-node-2") == "succeeded", 60, "the good event", worker)
    finally:
        worker.stop()
    with Session(db) as s:
        (rejected,) = s.scalars(select(RejectedEvent)).all()
    assert "kind" in rejected.error and "exploded" in rejected.payload


def test_events_published_while_workers_are_down_are_not_lost(
    env, bus, db, tmp_path, redis_client, redis_prefix
) -> None:  # noqa: ANN001
    env = {**env, "REMEDIATION_POLICY__BREAKER_MAX_FRACTION": "1.0"}  # 3 of 8 at once is not a storm here
    world = MemoryWorld(nodes=[f"gpu-node-{i}" for i in range(8)], journal=tmp_path / "world.json")
    bus.publish([fail_event(f"gpu-node-{i}", reason="down while no worker", world=world) for i in range(3)])
    worker = Worker(env, tmp_path)
    try:
        wait_for(
            lambda: all(remediation_status(db, f"gpu-node-{i}") == "succeeded" for i in range(3)),
            90,
            "all three",
            worker,
        )
    finally:
        worker.stop()
    assert redis_client.xlen(f"{redis_prefix}:events") == 0


def test_bad_config_stops_the_worker_naming_the_field(env, tmp_path) -> None:  # noqa: ANN001
    bad = {**env, "REMEDIATION_POLICY__MAX_CONCURRENT": "0"}
    proc = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "remediation.workers.celery_app", "worker"],
        cwd=ROOT,
        env=bad,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0
    assert "policy.max_concurrent" in proc.stderr
