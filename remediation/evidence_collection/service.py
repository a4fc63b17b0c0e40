"""Collected evidence kept, read and pruned: one ``evidence_items`` row per command's output, the
output itself in the row when small, else in the evidence store with its location in the row.

:func:`keep` writes what a collect_evidence step brought back (safe to run twice), :func:`items` and
:func:`content` are what the CLI, the API and the dashboard read, :func:`prune` removes what
``retention.evidence_older_than`` has passed, files and objects first.

Why: docs/policy.md#where-it-is-kept
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import delete, func, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session, sessionmaker

from remediation.clock import aware
from remediation.db.models import EvidenceItem, Remediation, RemediationStep
from remediation.domain.statemachine import Step
from remediation.evidence_collection.rules import Item
from remediation.ports.errors import NotFound, PermanentError
from remediation.ports.evidence import EvidenceStorage, EvidenceStore
from remediation.services.read_rows import EvidenceItemRow, RecordNotFound

log = logging.getLogger(__name__)

#: What ``where`` says of an item kept in its row.
IN_DATABASE = "database"
#: How much of an item kept in its row the read model shows: lines, and characters in all.
HEAD_LINES, HEAD_CHARS = 5, 2000


class NoSuchItem(RecordNotFound):
    """No item of that name (or id) in that remediation; the message is one readable sentence."""


@dataclass(frozen=True)
class EvidenceRetention:
    """What the prune removes: the items of remediations closed longer ago than ``older_than``, with
    their files or objects in ``storage``."""

    older_than: timedelta
    storage: EvidenceStorage


@dataclass(frozen=True)
class PrunedEvidence:
    cutoff: datetime
    items: int  # rows deleted (or, in a dry run, that would be)
    blobs: int  # files or objects removed (or already gone), or that would be
    left: int = 0  # locations the store could not remove (another backend's, or refused): rows gone all the same


def text_of(data: bytes) -> str:
    """An output as text: UTF-8, a byte that is not replaced (the output is a record, not an input)."""
    return data.decode("utf-8", errors="replace")


def store_key(rem: Remediation, row: RemediationStep, name: str) -> str:
    """Where an item goes in the store: one key per remediation, step row and command."""
    return f"{rem.cluster}/{rem.node}/r{rem.id}/s{row.id}/{name}"


def keep(s: Session, rem: Remediation, row: RemediationStep, *, items: Sequence[Item],
         store: EvidenceStorage, now: datetime) -> int:
    """Write one row per item of step ``row`` (and put a large one in the store first); an item the
    step already kept is skipped, so a rerun after a crash writes nothing twice. Returns rows written."""
    kept = set(s.scalars(select(EvidenceItem.name).where(EvidenceItem.step_id == row.id)))
    values = [_values(rem, row, item, store=store, now=now) for item in items if item.name not in kept]
    if not values:
        return 0
    insert = postgresql.insert if s.get_bind().dialect.name == "postgresql" else sqlite.insert
    ins = insert(EvidenceItem).on_conflict_do_nothing(index_elements=["step_id", "name"])
    return len(s.execute(ins.returning(EvidenceItem.id), values).all())


def _values(rem: Remediation, row: RemediationStep, item: Item, *, store: EvidenceStorage,
            now: datetime) -> dict[str, Any]:
    """One item's row: in the row when small, else in the store, or (no store) cut to fit the row."""
    data, location = item.content, None
    if len(data) > store.inline_bytes:
        if store.blobs is None:
            data = data[:store.inline_bytes]
        else:
            location = store.blobs.put(store_key(rem, row, item.name), data)
    return {
        "cluster": rem.cluster, "remediation_id": rem.id, "step_id": row.id, "node": rem.node,
        "name": item.name, "status": item.status, "exit_code": item.exit_code, "duration_s": item.duration_s,
        "size_bytes": len(data), "truncated": item.truncated or len(data) < len(item.content),
        "sha256": hashlib.sha256(data).hexdigest(),
        "content": text_of(data) if location is None else None, "location": location, "collected_at": now,
    }


def items(s: Session, remediation_id: int) -> list[EvidenceItemRow]:
    """The remediation's items without their content, newest step first, then as the job ran them."""
    q = (select(EvidenceItem).where(EvidenceItem.remediation_id == remediation_id)
         .order_by(EvidenceItem.step_id.desc(), EvidenceItem.id))
    return [_row(x) for x in s.scalars(q)]


def _row(x: EvidenceItem) -> EvidenceItemRow:
    head = x.content[:HEAD_CHARS].splitlines()[:HEAD_LINES] if x.content is not None else []
    return EvidenceItemRow(
        id=x.id, step_id=x.step_id, name=x.name, status=x.status, exit_code=x.exit_code,
        duration_s=x.duration_s, size_bytes=x.size_bytes, truncated=x.truncated, sha256=x.sha256,
        where=x.location or IN_DATABASE, collected_at=aware(x.collected_at), head=head,
    )


def note(s: Session, remediation_id: int) -> str | None:
    """What the newest collect_evidence step said (its outcome, else its error): the line shown
    where it kept no item ("no evidence: ..."). None: no such step."""
    q = (select(RemediationStep).where(RemediationStep.remediation_id == remediation_id,
                                       RemediationStep.step == Step.COLLECT_EVIDENCE)
         .order_by(RemediationStep.id.desc()).limit(1))
    row = s.scalars(q).first()
    return None if row is None else row.outcome or row.error


def find(s: Session, remediation_id: int, name: str, *, step_id: int | None = None) -> EvidenceItem:
    """The item ``name`` of the remediation: of step ``step_id``, else of its newest step that kept one."""
    q = select(EvidenceItem).where(EvidenceItem.remediation_id == remediation_id, EvidenceItem.name == name)
    if step_id is not None:
        q = q.where(EvidenceItem.step_id == step_id)
    found = s.scalars(q.order_by(EvidenceItem.step_id.desc()).limit(1)).first()
    if found is None:
        raise NoSuchItem(f"remediation #{remediation_id} kept no collected evidence named {name!r}"
                         + (f" at step row {step_id}" if step_id is not None else ""))
    return found


def content(s: Session, item_id: int, store: EvidenceStorage) -> str:
    """One item's whole text: from its row, else from the store."""
    x = s.get(EvidenceItem, item_id)
    if x is None:
        raise NoSuchItem(f"no collected evidence item #{item_id}")
    return whole(x, store)


def whole(x: EvidenceItem, store: EvidenceStorage) -> str:
    """The text of item ``x``: its row's, else what the store keeps at its location."""
    if x.content is not None:
        return x.content
    if store.blobs is None or x.location is None:
        raise PermanentError(f"collected evidence {x.name} is kept at {x.location}, and evidence.store.backend "
                             "is database: set the backend that wrote it to read it")
    try:
        return text_of(store.blobs.get(x.location))
    except NotFound as exc:
        raise NoSuchItem(f"collected evidence {x.name} of remediation #{x.remediation_id} is no longer "
                         f"kept: {exc.message}") from exc


def prune(sessions: sessionmaker[Session], *, retention: EvidenceRetention, now: datetime, batch: int = 1000,
          dry_run: bool = False) -> PrunedEvidence:
    """Delete the items of remediations closed before ``now - retention.older_than``, ``batch`` per
    transaction, each item's file or object before its row (one already gone is fine). An open
    remediation keeps its items whatever their age."""
    cutoff = now - retention.older_than
    old = EvidenceItem.remediation_id.in_(select(Remediation.id).where(Remediation.closed_at < cutoff))
    if dry_run:
        with sessions() as s:
            counted = s.execute(select(func.count(), func.count(EvidenceItem.location)).where(old)).one()
        return PrunedEvidence(cutoff, counted[0], counted[1])
    pruned = blobs = left = 0
    while True:
        with sessions() as s, s.begin():
            rows = s.execute(select(EvidenceItem.id, EvidenceItem.location).where(old).order_by(EvidenceItem.id)
                             .limit(batch).with_for_update(skip_locked=True)).all()
            for _, location in rows:
                if location is None:
                    continue
                if _remove(retention.storage.blobs, location):
                    blobs += 1
                else:
                    left += 1
            s.execute(delete(EvidenceItem).where(EvidenceItem.id.in_([r.id for r in rows])))
        pruned += len(rows)
        if len(rows) < batch:
            break
    log.info("prune: deleted %d collected evidence item(s) of remediations closed before %s, %d file(s) or "
             "object(s); %d location(s) left", pruned, cutoff.isoformat(), blobs, left)
    return PrunedEvidence(cutoff, pruned, blobs, left)


def _remove(blobs: EvidenceStore | None, location: str) -> bool:
    """Remove one file or object; False when the store cannot (none configured, or a location it
    refuses). A store that fails otherwise (unreachable, denied) stops the prune: its rows stay."""
    if blobs is None:
        log.warning("prune: %s stays: evidence.store.backend is database", location)
        return False
    try:
        blobs.delete(location)
    except NotFound:
        return True
    except PermanentError as exc:
        log.warning("prune: %s stays: %s", location, exc.message)
        return False
    return True
