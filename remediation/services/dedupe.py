"""Dedupe keys bound to content: a key names one condition instance only with what it first said.

An event whose key is already taken by other content is recorded under its key bound to its own
content, so an entry sent ahead under the key a real edge will carry cannot make that edge a
duplicate.

Why: docs/architecture.md#believe-nothing-unchecked
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from remediation.db.models import Event
from remediation.db.queries import among
from remediation.domain.events import NodeEvent

Content = tuple[str, str, str, str, str]


def content(ev: NodeEvent) -> Content:
    """What an event says, as a key must keep naming it."""
    return (ev.source.value, ev.node, ev.kind.value, ev.state, ev.reason)


def rebound(ev: NodeEvent) -> NodeEvent:
    """``ev`` under its key bound to its content (``<key>#<digest>``)."""
    digest = hashlib.sha256("\x1f".join(content(ev)).encode()).hexdigest()[:16]
    return ev.model_copy(update={"dedupe_key": f"{ev.dedupe_key[:495]}#{digest}"})


def unique_by_key(events: Iterable[NodeEvent]) -> tuple[dict[str, NodeEvent], int]:
    """The batch's events by key, the first of each kept, and how many were duplicates. A key
    repeated with other content is no duplicate: that event is kept under its bound key."""
    unique: dict[str, NodeEvent] = {}
    duplicates = 0
    for ev in events:
        first = unique.get(ev.dedupe_key)
        if first is not None and content(first) != content(ev):
            ev = rebound(ev)
            first = unique.get(ev.dedupe_key)
        if first is None:
            unique[ev.dedupe_key] = ev
        else:
            duplicates += 1
    return unique, duplicates


def taken_by_others(session: Session, missed: Sequence[NodeEvent]) -> list[NodeEvent]:
    """Of events whose key was already recorded, the ones whose recorded event says something else,
    each under its bound key (a recorded event under that too is a true duplicate)."""
    by_key = {ev.dedupe_key: ev for ev in missed}
    if not by_key:
        return []
    recorded = session.execute(
        select(Event.dedupe_key, Event.source, Event.node, Event.kind, Event.state, Event.reason)
        .where(among(session, Event.dedupe_key, by_key))
    )
    return [rebound(by_key[key]) for key, *said in recorded if tuple(said) != content(by_key[key])]
