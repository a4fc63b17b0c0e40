"""Isolation at fleet speed (workers/isolate.py): many new remediations through slurm_drain and
k8s_cordon at once, each step once, and the dispatcher that groups them into remediation.isolate tasks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import select

from remediation.adapters.celery import ISOLATE_TASK, CeleryDispatcher, step_task
from remediation.adapters.memory import MemoryKube, MemorySlurm, MemoryVM, MemoryWorld
from remediation.clock import SystemClock
from remediation.db.models import RemediationStep
from remediation.db.session import make_engine, make_session_factory
from remediation.domain.events import EventKind, NodeEvent, Source
from remediation.domain.step_bodies import Adapters
from remediation.ports.dispatch import FollowUp
from remediation.services.ingest import ingest
from remediation.services.workflow import Workflow
from remediation.settings import DatabaseSettings, Settings
from remediation.workers.isolate import isolate

NODES = [f"gpu-node-{i}" for i in range(24)]


def test_a_batch_is_isolated_at_once_each_step_once(pg_url: str, tmp_path: Path) -> None:
    world = MemoryWorld(nodes=NODES, journal=tmp_path / "world.json")  # a file lock: safe across threads
    settings = Settings(policy={"min_restart_gap_s": 0}, workflow={"poll_interval_s": 5})
    db = make_engine(DatabaseSettings(url=pg_url))
    sessions = make_session_factory(db)
    clock = SystemClock()
    workflow = Workflow(
        sessions, Adapters(MemorySlurm(world), MemoryKube(world), MemoryVM(world)), settings, clock=clock
    )
    for n in NODES:  # the rack's nodes marked failed in Slurm, as the events report
        world.set_slurm(n, flags=["FAIL"], reason="rack PDU lost power")
    events = [NodeEvent(source=Source.SLURM, node=n, kind=EventKind.UNHEALTHY, state="IDLE+FAIL",
                        reason="rack PDU lost power", observed_at=clock.now()).to_json() for n in NODES]  # fmt: skip
    with sessions() as s, s.begin():
        opened = ingest(s, events, settings.policy, clock=clock).opened
    ids = [rid for rid, _ in opened]

    after = isolate(workflow, ids, threads=8)

    assert [f.step if f else None for f in after] == ["k8s_evict"] * len(NODES)
    with sessions() as s:
        rows = s.execute(
            select(RemediationStep.remediation_id, RemediationStep.step, RemediationStep.status)
        ).all()
    assert sorted((rid, step) for rid, step, status in rows if status == "done") == sorted(
        (rid, step) for rid in ids for step in ("slurm_drain", "k8s_cordon")
    )
    drains = [c["node"] for c in world.calls("slurm.drain", effect=True)]
    cordons = [c["node"] for c in world.calls("k8s.cordon", effect=True)]
    assert sorted(drains) == sorted(NODES) and sorted(cordons) == sorted(NODES)

    # The same task delivered again (its worker died before the ack): nothing is done twice.
    assert isolate(workflow, ids, threads=8) == [None] * len(NODES)
    assert len(world.calls("slurm.drain", effect=True)) == len(NODES)
    assert len(world.calls("k8s.cordon", effect=True)) == len(NODES)
    db.dispose()


class SentTasks:
    def __init__(self) -> None:
        self.sent: list[tuple[str, Any, Any]] = []

    def send_task(self, name: str, args: Any = None, countdown: Any = None, queue: str = "", priority: int = 0,
                  kwargs: Any = None) -> None:
        self.sent.append((name, args, countdown))


def test_first_steps_due_now_go_in_isolate_tasks_and_the_rest_alone() -> None:
    app = SentTasks()
    followups = [FollowUp(i, "slurm_drain") for i in range(1, 6)]
    followups += [FollowUp(7, "slurm_drain", 30.0), FollowUp(8, "k8s_evict"), None]
    CeleryDispatcher(app, isolate_batch=2).steps(followups)  # type: ignore[arg-type]
    assert app.sent == [
        (ISOLATE_TASK, [[1, 2]], None), (ISOLATE_TASK, [[3, 4]], None), (ISOLATE_TASK, [[5]], None),
        (step_task("slurm_drain"), [7], 30.0), (step_task("k8s_evict"), [8], None),
    ]  # fmt: skip
