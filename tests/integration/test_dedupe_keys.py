"""A dedupe key sent ahead hides no real edge, on real Postgres: a key names one condition instance only
with the content it was first recorded with, across batches and within one."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from remediation.clock import FakeClock
from remediation.db.models import Event, Remediation
from remediation.domain.events import EventKind, NodeEvent, Source
from remediation.services.ingest import ingest
from remediation.settings import Settings

NODE = "gpu-node-3"
T0 = datetime(2026, 11, 28, 12, 0, tzinfo=UTC)
KEY = f"slurm:{NODE}:FAIL:2026-11-28T12:00:00:0a1b2c3d"  # Slurm's keys can be foretold
POLICY = Settings().policy


def said(kind: EventKind, state: str, reason: str, at: datetime) -> str:
    return NodeEvent(source=Source.SLURM, node=NODE, kind=kind, state=state, reason=reason, observed_at=at,
                     dedupe_key=KEY).to_json()


AHEAD = said(EventKind.HEALTHY, "IDLE", "", T0)
REAL = said(EventKind.UNHEALTHY, "FAIL", "xid 79", T0 + timedelta(seconds=5))


def recorded(sessions: sessionmaker[Session]) -> list[tuple[str, str, str]]:
    with sessions() as s:
        return [(k, st, d) for k, st, d in s.execute(
            select(Event.dedupe_key, Event.state, Event.decision).where(Event.node == NODE).order_by(Event.id))]


def opened(sessions: sessionmaker[Session]) -> list[str]:
    with sessions() as s:
        return list(s.scalars(select(Remediation.node)))


def test_a_key_taken_in_an_earlier_batch_hides_no_real_edge(sessions: sessionmaker[Session]) -> None:
    clock = FakeClock(T0 + timedelta(seconds=10))
    for batch in ([AHEAD], [REAL], [REAL]):  # the last: the real edge re-sent, a true duplicate
        with sessions() as s, s.begin():
            result = ingest(s, batch, POLICY, clock=clock)
    assert result.duplicates == 1 and result.recorded == 0
    (first, _, _), (bound, state, decision) = recorded(sessions)
    assert first == KEY and bound.startswith(f"{KEY}#") and (state, decision) == ("FAIL", "open")
    assert opened(sessions) == [NODE]


def test_a_key_taken_earlier_in_the_same_batch_hides_no_real_edge(sessions: sessionmaker[Session]) -> None:
    with sessions() as s, s.begin():
        result = ingest(s, [AHEAD, REAL, REAL], POLICY, clock=FakeClock(T0 + timedelta(seconds=10)))
    assert result.recorded == 2 and result.duplicates == 1
    assert [state for _, state, _ in recorded(sessions)] == ["IDLE", "FAIL"]
    assert opened(sessions) == [NODE]


def test_the_same_condition_re_sent_is_still_one_event(sessions: sessionmaker[Session]) -> None:
    clock = FakeClock(T0 + timedelta(seconds=10))
    for _ in range(3):
        with sessions() as s, s.begin():
            ingest(s, [REAL], POLICY, clock=clock)
    assert [k for k, _, _ in recorded(sessions)] == [KEY]
