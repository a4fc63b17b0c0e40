"""Retention: prune old observed events, never a remediation's own and never the audit log.

An event older than ``retention.events_older_than`` goes only when no remediation was opened by it or
attributed it; ``rejected_events`` go by the same age. Collected evidence goes with its files and
objects once its remediation has been closed ``retention.evidence_older_than``. Deletes run in batches
of ``retention.batch`` rows, one transaction each. A dry run counts exactly what a real run would delete.

Why: docs/architecture.md#retention-prunes-observations-never-evidence
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, cast

from sqlalchemy import CursorResult, delete, exists, func, select
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.sql.elements import ColumnElement

from remediation.db.models import AuditLog, Event, RejectedEvent, Remediation
from remediation.evidence_collection.service import EvidenceRetention, PrunedEvidence
from remediation.evidence_collection.service import prune as prune_collected

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PruneResult:
    cutoff: datetime
    dry_run: bool
    events_pruned: int  # deleted, or with dry_run, that would be deleted
    events_kept_linked: int  # older than the cutoff, kept because a remediation owns them
    audit_rows: int  # audit rows in the table (never pruned), for the report
    rejected_pruned: int = 0  # refused payloads received before the cutoff: deleted, or would be
    evidence: PrunedEvidence | None = None  # collected evidence pruned (None: not asked)


def _old(cutoff: datetime) -> ColumnElement[bool]:
    return Event.observed_at < cutoff


def _unlinked() -> ColumnElement[bool]:
    opened_one = exists().where(Remediation.event_id == Event.id)
    return Event.remediation_id.is_(None) & ~opened_one


def prune_events(
    sessions: sessionmaker[Session],
    older_than: timedelta,
    now: datetime,
    *,
    batch: int = 10000,
    dry_run: bool = False,
    evidence: EvidenceRetention | None = None,
) -> PruneResult:
    """Delete (or with ``dry_run`` only count) unlinked events observed before ``now - older_than``,
    and with ``evidence`` the collected evidence it says."""
    if older_than <= timedelta(0):
        raise ValueError("older_than must be a positive duration")
    cutoff = now - older_than
    with sessions() as s:
        kept = s.scalar(select(func.count()).select_from(Event).where(_old(cutoff), ~_unlinked())) or 0
        audit_rows = s.scalar(select(func.count()).select_from(AuditLog)) or 0
        if dry_run:
            would = s.scalar(select(func.count()).select_from(Event).where(_old(cutoff), _unlinked())) or 0
            log.info(
                "prune (dry-run): would delete %d event(s) observed before %s; %d linked kept",
                would,
                cutoff.isoformat(),
                kept,
            )
            junk = s.scalar(select(func.count()).select_from(RejectedEvent).where(_old_rejected(cutoff))) or 0
    if dry_run:
        collected = _collected(sessions, evidence, now, batch=batch, dry_run=True)
        return PruneResult(cutoff, True, would, kept, audit_rows, junk, collected)
    pruned = _delete_batches(sessions, Event.id, _old(cutoff) & _unlinked(), batch=batch)
    rejected = _delete_batches(sessions, RejectedEvent.id, _old_rejected(cutoff), batch=batch)
    log.info(
        "prune: deleted %d event(s) and %d rejected payload(s) from before %s; %d linked kept; "
        "audit log untouched",
        pruned,
        rejected,
        cutoff.isoformat(),
        kept,
    )
    # Last: a store that fails (unreachable, denied) leaves the events already pruned.
    collected = _collected(sessions, evidence, now, batch=batch, dry_run=False)
    return PruneResult(cutoff, False, pruned, kept, audit_rows, rejected, collected)


def _collected(sessions: sessionmaker[Session], evidence: EvidenceRetention | None, now: datetime, *,
               batch: int, dry_run: bool) -> PrunedEvidence | None:
    if evidence is None:
        return None
    return prune_collected(sessions, retention=evidence, now=now, batch=batch, dry_run=dry_run)


def _old_rejected(cutoff: datetime) -> ColumnElement[bool]:
    return RejectedEvent.received_at < cutoff


def _delete_batches(sessions: sessionmaker[Session], key: Any, where: ColumnElement[bool], *,
                    batch: int) -> int:
    """Delete the rows of ``key``'s table matching ``where``, ``batch`` rows per transaction."""
    table = key.class_
    pruned = 0
    while True:
        with sessions() as s, s.begin():
            ids = select(key).where(where).limit(batch).with_for_update(skip_locked=True)
            result = cast(CursorResult[Any], s.execute(delete(table).where(key.in_(ids.scalar_subquery()))))
            done = result.rowcount or 0
        pruned += done
        if done < batch:
            return pruned
