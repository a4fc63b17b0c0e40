"""The release task acts on a committed human release only: it re-reads the audit row a request names
from Postgres, and a row that is no release, a dry-run one, one for a node quarantined again since, or
no row at all hands nothing back. Whoever can write the requests queue can name a row, not forge one."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from remediation.db.models import AuditLog
from remediation.services import lever_rules
from remediation.services.audit import audit
from tests.integration.history import History, history, sessions  # noqa: F401  (fixtures)

NODE = "gpu-node-8"  # quarantined by the history


def handed_back(sessions: sessionmaker[Session], audit_id: int) -> str | None:
    with sessions() as s:
        return lever_rules.committed_release(s, audit_id)


def test_only_a_committed_human_release_that_still_stands_is_handed_back(
    history: History, sessions: sessionmaker[Session]
) -> None:
    with sessions() as s:
        before = list(s.scalars(select(AuditLog.id)))
        last = int(s.scalar(select(func.max(AuditLog.id))) or 0)
    assert before and [handed_back(sessions, i) for i in before] == [None] * len(before)  # opens, quarantines
    assert handed_back(sessions, last + 1000) is None  # no such row
    with sessions() as s, s.begin():
        dry = audit(s, datetime.now(UTC), "mallory", action="release", target=NODE, reason="dry",
                    dry_run=True)
        s.flush()
        dry_id = dry.id
    assert handed_back(sessions, dry_id) is None
    with sessions() as s, s.begin():
        released = lever_rules.release(s, NODE, "alice", reason="GPU swapped", now=datetime.now(UTC))
    assert handed_back(sessions, released.audit_id) == NODE
    with sessions() as s, s.begin():
        lever_rules.quarantine(s, NODE, "bob", reason="still flaky", now=datetime.now(UTC))
    assert handed_back(sessions, released.audit_id) is None  # quarantined again since: not undone
