"""Retention on real Postgres: `remediation db prune` removes old events nobody owns, keeps every
remediation's own events and every audit row, and its --dry-run deletes nothing; beat runs it.

The CLI runs as a real process (`python -m remediation.cli`, the console script), as an admin on the database host runs it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from remediation.adapters.celery import PRUNE_TASK
from remediation.db.models import AuditLog, Event, Node, RejectedEvent, Remediation
from remediation.db.session import make_engine, make_session_factory
from remediation.settings import DatabaseSettings, Settings

ROOT = Path(__file__).resolve().parents[2]
NOW = datetime.now(UTC)
OLD = NOW - timedelta(days=120)


@pytest.fixture
def sessions(pg_url: str) -> Iterator[sessionmaker[Session]]:
    engine = make_engine(DatabaseSettings(url=pg_url))
    yield make_session_factory(engine)
    engine.dispose()


def _event(key: str, at: datetime, remediation_id: int | None = None) -> Event:
    return Event(
        dedupe_key=key,
        source="slurm",
        node="gpu-node-1",
        kind="unhealthy",
        state="FAIL",
        reason="xid 79",
        observed_at=at,
        received_at=at,
        remediation_id=remediation_id,
    )


@pytest.fixture
def seeded(sessions: sessionmaker[Session]) -> dict[str, int]:
    """Old events: two unlinked, one attributed to a remediation, one that opened a remediation; one
    recent unlinked event; and an old audit row."""
    with sessions() as s, s.begin():
        s.add(Node(name="gpu-node-1", status="healthy", first_seen_at=OLD, updated_at=OLD))
        s.flush()
        opener = _event("old-opener", OLD)
        s.add_all(
            [
                opener,
                _event("old-1", OLD),
                _event("old-2", OLD - timedelta(days=30)),
                _event("recent", NOW - timedelta(days=10)),
            ]
        )
        s.flush()
        rem = Remediation(
            node="gpu-node-1",
            cause="xid 79",
            source="slurm",
            status="succeeded",
            step="done",
            ladder=0,
            opened_at=OLD,
            updated_at=OLD,
            closed_at=OLD,
            event_id=opener.id,
            context={},
        )
        s.add(rem)
        s.flush()
        s.add(_event("old-attributed", OLD, remediation_id=rem.id))
        s.add(
            AuditLog(
                at=OLD - timedelta(days=400),
                actor="alice",
                action="release",
                target="gpu-node-1",
                reason="fixed",
                detail={},
            )
        )
        return {"remediation": rem.id}


def _keys(sessions: sessionmaker[Session]) -> set[str]:
    with sessions() as s:
        return set(s.scalars(select(Event.dedupe_key)))


def _cli(pg_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("REMEDIATION_")}
    env.update({"REMEDIATION_DATABASE__URL": pg_url, "PYTHONPATH": str(ROOT)})
    return subprocess.run(
        [sys.executable, "-m", "remediation.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_dry_run_counts_and_deletes_nothing(
    pg_url: str, sessions: sessionmaker[Session], seeded: dict[str, int]
) -> None:
    before = _keys(sessions)
    out = _cli(pg_url, "db", "prune", "--older-than", "90d", "--dry-run")
    assert out.returncode == 0, out.stderr
    assert "would delete 2 event(s)" in out.stdout and "kept 2 older event(s)" in out.stdout
    assert "nothing deleted" in out.stdout
    assert _keys(sessions) == before


def test_prune_removes_old_unlinked_events_only_and_never_audit_rows(
    pg_url: str, sessions: sessionmaker[Session], seeded: dict[str, int]
) -> None:
    out = _cli(pg_url, "db", "prune", "--older-than", "90d")
    assert out.returncode == 0, out.stderr
    assert "deleted 2 event(s)" in out.stdout
    assert _keys(sessions) == {"old-opener", "old-attributed", "recent"}
    with sessions() as s:
        assert s.scalar(select(func.count()).select_from(AuditLog)) == 1  # 400 days old, still there
        rem = s.get(Remediation, seeded["remediation"])
        assert rem is not None and rem.event_id is not None and s.get(Event, rem.event_id) is not None
    # A shorter age now reaches the recent event too; the linked ones still stay.
    out = _cli(pg_url, "db", "prune", "--older-than", "1d")
    assert out.returncode == 0 and "deleted 1 event(s)" in out.stdout, out.stdout + out.stderr
    assert _keys(sessions) == {"old-opener", "old-attributed"}


@pytest.mark.parametrize("bad", ["90x", "-3d", "soon", "0h"], ids=["unit", "negative", "word", "zero"])
def test_bad_age_is_a_clear_error_and_deletes_nothing(
    pg_url: str, sessions: sessionmaker[Session], seeded: dict[str, int], bad: str
) -> None:
    before = _keys(sessions)
    out = _cli(pg_url, "db", "prune", "--older-than", bad)
    assert out.returncode == 2
    assert out.stderr.startswith("error: --older-than") and "duration" in out.stderr
    assert _keys(sessions) == before


def test_beat_schedules_the_prune_and_the_worker_knows_the_task() -> None:
    from remediation.workers.celery_app import make_app

    app = make_app(Settings(retention={"prune_interval_s": 3600, "events_older_than": "30d"}))
    entry = app.conf.beat_schedule["prune-events"]
    assert entry == {"task": PRUNE_TASK, "schedule": 3600}
    assert "prune-events" not in make_app(Settings(retention={"prune_interval_s": 0})).conf.beat_schedule
    import remediation.workers.tasks

    assert remediation.workers.tasks.app.tasks[PRUNE_TASK].name == PRUNE_TASK


def test_prune_removes_old_rejected_payloads_and_keeps_recent_ones(
    pg_url: str, sessions: sessionmaker[Session], seeded: dict[str, int]
) -> None:
    """A flooded stream leaves refused payloads behind: they go by the events' age, recent ones stay."""
    with sessions() as s, s.begin():
        rows = [RejectedEvent(received_at=at, payload="{junk", error="not JSON")
                for at in (OLD, OLD - timedelta(days=9), NOW - timedelta(days=1))]
        s.add_all(rows)
        s.flush()
        old_ids, recent_id = {rows[0].id, rows[1].id}, rows[2].id
    dry = _cli(pg_url, "db", "prune", "--older-than", "90d", "--dry-run")
    assert "would delete 2 rejected payload(s)" in dry.stdout, dry.stdout + dry.stderr
    out = _cli(pg_url, "db", "prune", "--older-than", "90d")
    assert out.returncode == 0 and "deleted 2 rejected payload(s)" in out.stdout, out.stdout + out.stderr
    with sessions() as s:
        left = set(s.scalars(select(RejectedEvent.id).where(RejectedEvent.id.in_([*old_ids, recent_id]))))
    assert left == {recent_id}
