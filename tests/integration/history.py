"""A realistic on-call history, built the way production builds it: watcher events go through
``ingest`` and the workflow ``Workflow`` drives every step against the in-memory world.

Shared by the CLI, API, metrics and notification tests so they all look at the same story:

- gpu-node-3: one failure (slurm FAIL "xid 79"), remediated successfully;
- gpu-node-9: two failures, both remediated (a repeat offender on the leaderboard);
- gpu-node-8: its VM never comes back; the ladder (restart, reimage) is climbed, then it is quarantined;
- gpu-node-4: drained with two jobs still running, so its remediation is open and waiting;
- gpu-node-0..9 all exist in the inventory; one malformed payload sits in rejected_events.

Time starts two days ago on a fake clock, so relative times and "last N days" windows are realistic
against the real clock the CLI and API use.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from remediation.adapters.memory import MemoryKube, MemorySlurm, MemoryVM, MemoryWorld
from remediation.clock import FakeClock
from remediation.db.models import Remediation
from remediation.db.session import make_engine, make_session_factory
from remediation.domain.events import EventKind, NodeEvent, Source
from remediation.domain.step_bodies import Adapters
from remediation.ports.dispatch import Dispatcher, FollowUp, SweeperOnly
from remediation.services.ingest import ingest
from remediation.services.lever_rules import committed_release
from remediation.services.workflow import Workflow
from remediation.settings import DatabaseSettings, Settings
from tests.faults import show_fault

NODES = [f"gpu-node-{i}" for i in range(10)]


@dataclass
class History:
    ok: int  # gpu-node-3's succeeded remediation
    quarantined: int  # gpu-node-8's quarantined remediation
    waiting: int  # gpu-node-4's open remediation
    start: datetime


def engine_settings(**extra: object) -> Settings:
    return Settings(
        policy={"min_restart_gap_s": 0, "breaker_min_failures": 50, "breaker_max_fraction": 1.0},
        workflow={"poll_interval_s": 5, "drain_timeout_s": 6000, "verify_timeout_s": 120, "lease_s": 30},
        **extra,  # type: ignore[arg-type]
    )


def publish(sessions: sessionmaker[Session], settings: Settings, clock: FakeClock, node: str,
            state: str = "FAIL", reason: str = "xid 79", kind: EventKind = EventKind.UNHEALTHY,
            world: MemoryWorld | None = None) -> list[FollowUp]:
    """Ingest the Slurm watcher's event; given the ``world``, a fault is first shown there as Slurm
    shows it before its watcher sees it (the workflow confirms every event in Slurm before acting)."""
    if world is not None and kind is EventKind.UNHEALTHY:
        show_fault(world, node, state, reason)
    event = NodeEvent(source=Source.SLURM, node=node, kind=kind, state=state, reason=reason,
                      observed_at=clock.now())
    with sessions() as s, s.begin():
        result = ingest(s, [event.to_json()], settings.policy, clock=clock)
    return [FollowUp(rid, step) for rid, step in result.opened]


def drive(engine: Workflow, clock: FakeClock, todo: list[FollowUp], limit: int = 2000) -> None:
    queue = deque(todo)
    for _ in range(limit):
        if not queue:
            return
        f = queue.popleft()
        clock.advance(f.countdown or 1)
        nxt = engine.run(f.remediation_id, f.step)
        if nxt is not None:
            queue.append(nxt)
    raise AssertionError("workflow did not settle")


def _latest(sessions: sessionmaker[Session], node: str) -> int:
    with sessions() as s:
        return int(s.scalar(select(Remediation.id).where(Remediation.node == node)
                            .order_by(Remediation.id.desc()).limit(1)) or 0)


def build(sessions: sessionmaker[Session], settings: Settings | None = None) -> History:
    settings = settings or engine_settings()
    start = datetime.now(UTC).replace(microsecond=0) - timedelta(days=2)
    clock = FakeClock(start)
    world = MemoryWorld(nodes=NODES)
    engine = Workflow(sessions, Adapters(MemorySlurm(world), MemoryKube(world), MemoryVM(world)), settings,
                      clock=clock)
    for node in NODES:
        publish(sessions, settings, clock, node, state="IDLE", reason="", kind=EventKind.INVENTORY)
    with sessions() as s, s.begin():
        ingest(s, [b"{not json"], settings.policy, clock=clock)

    drive(engine, clock, publish(sessions, settings, clock, "gpu-node-3", world=world))
    ok = _latest(sessions, "gpu-node-3")
    clock.advance(3600)
    for i in range(2):
        fault = publish(sessions, settings, clock, "gpu-node-9", reason=f"xid {48 + i}", world=world)
        drive(engine, clock, fault)
        clock.advance(3600)
    with world.mutate() as st:
        st["nodes"]["gpu-node-8"]["vm"]["broken"] = True
    down = publish(sessions, settings, clock, "gpu-node-8", state="DOWN", reason="Not responding", world=world)
    drive(engine, clock, down)
    quarantined = _latest(sessions, "gpu-node-8")
    clock.advance(3600)
    world.set_jobs("gpu-node-4", 2)
    (f,) = publish(sessions, settings, clock, "gpu-node-4", state="DRAIN", reason="ecc errors", world=world)
    engine.run(f.remediation_id, f.step)  # drains, then waits for the jobs: left open
    return History(ok=ok, quarantined=quarantined, waiting=f.remediation_id, start=start)


class RecordingDispatcher:
    """Stands in for the Celery dispatcher: records what a lever handed over after its commit."""

    def __init__(self) -> None:
        self.steps_called: list[FollowUp] = []
        self.releases: list[int] = []  # the audit ids of the human releases handed over

    def steps(self, followups: object) -> None:
        self.steps_called.extend(f for f in followups if f is not None)  # type: ignore[attr-defined]

    def release(self, audit_id: int) -> None:
        self.releases.append(audit_id)

    def released(self, sessions: sessionmaker[Session]) -> list[str]:
        """The nodes the release task would hand back for what it was handed (it re-reads each row)."""
        with sessions() as s:
            return [node for i in self.releases if (node := committed_release(s, i)) is not None]


# ---- fixtures shared by the on-call tests (API, browser): import them by name from here ----


@pytest.fixture
def sessions(pg_url: str) -> Iterator[sessionmaker[Session]]:
    """Sessions on this test's own committed database (the API and CLI open their own connections)."""
    engine = make_engine(DatabaseSettings(url=pg_url))
    yield make_session_factory(engine)
    engine.dispose()


@pytest.fixture
def history(sessions: sessionmaker[Session]) -> History:
    return build(sessions)


@pytest.fixture
def dispatch() -> RecordingDispatcher:
    return RecordingDispatcher()


@pytest.fixture
def dispatcher(request: pytest.FixtureRequest) -> Dispatcher:
    """What the app or CLI under test is given to hand follow-up work to: the test's recorder when the
    test asks for ``dispatch``, otherwise no broker at all (as without the console script)."""
    if "dispatch" in request.fixturenames:
        rec: RecordingDispatcher = request.getfixturevalue("dispatch")
        return rec
    return SweeperOnly()
