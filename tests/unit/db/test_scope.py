"""Sessions scoped to one cluster (remediation.db.scope), on a migrated SQLite file."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import create_engine, delete, func, insert, select, update
from sqlalchemy.orm import Session, sessionmaker

from remediation.db.migrate import upgrade
from remediation.db.models import AuditLog, Control, Node
from remediation.db.queries import control_get, control_set
from remediation.db.scope import cluster_of, scope_of, scoped

NOW = datetime(2026, 11, 29, tzinfo=UTC)


@pytest.fixture
def sessions(tmp_path: Path) -> sessionmaker[Session]:
    url = f"sqlite:///{tmp_path / 'scope.db'}"
    upgrade(url)
    return sessionmaker(create_engine(url), expire_on_commit=False)


def node(name: str) -> Node:
    return Node(name=name, status="healthy", status_reason="", first_seen_at=NOW, updated_at=NOW)


def test_a_scoped_session_reads_and_writes_its_own_cluster_only(sessions) -> None:
    west, east = scoped(sessions, "west"), scoped(sessions, "east")
    with west() as s, s.begin():
        s.add(node("gpu-node-0"))  # flushed: the scope names the row
        s.execute(insert(AuditLog), [{"at": NOW, "actor": "a", "action": "pause", "target": ""}])  # bulk
    with east() as s, s.begin():
        s.add(node("gpu-node-0"))
        assert s.scalar(select(func.count()).select_from(Node)) == 1
        assert s.get(Node, ("west", "gpu-node-0")) is None  # by its key too
        s.execute(update(Node).values(status_reason="east only"))
        assert s.scalars(select(AuditLog)).all() == []
    with sessions() as s:  # unscoped: every cluster
        rows = s.execute(select(Node.cluster, Node.status_reason).order_by(Node.cluster)).all()
        assert [tuple(r) for r in rows] == [("east", "east only"), ("west", "")]
        assert s.scalars(select(AuditLog.cluster)).all() == ["west"]
    with west() as s, s.begin():
        s.execute(delete(Node))
    with sessions() as s:
        assert s.scalars(select(Node.cluster)).all() == ["east"]


def test_control_rows_are_per_cluster(sessions) -> None:
    west, east = scoped(sessions, "west"), scoped(sessions, "east")
    with west() as s, s.begin():
        control_set(s, "paused", {"paused": True}, now=NOW)
    with east() as s, s.begin():
        assert control_get(s, "paused") == {}
        control_set(s, "paused", {"paused": False}, now=NOW)
    with west() as s:
        assert control_get(s, "paused") == {"paused": True}
        every = s.execute(select(Control.cluster).execution_options(all_clusters=True)).scalars().all()
        assert sorted(every) == ["east", "west"]


def test_the_scope_is_named_and_an_unscoped_session_writes_the_default(sessions) -> None:
    with scoped(sessions, "west")() as s:
        assert scope_of(s) == cluster_of(s) == "west"
    with sessions() as s, s.begin():
        assert scope_of(s) is None and cluster_of(s) == "default"
        s.add(node("gpu-node-1"))
    with sessions() as s:
        assert s.scalars(select(Node.cluster)).all() == ["default"]
    with pytest.raises(ValueError, match="not a cluster name"):
        scoped(sessions, "West Coast")
