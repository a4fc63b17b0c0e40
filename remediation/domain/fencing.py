"""Fencing: a leader's events count only until a newer leader has published.

A leader lock with a TTL cannot by itself stop two watchers from publishing as leader: one paused
(SIGSTOP, a long GC, a frozen VM) past its TTL wakes up still believing it leads, and a Redis failover
can lose the lock key itself. So every lock holder gets a **fencing token** when it takes the lock, a
number higher than every token given before (:mod:`remediation.adapters.lock`), and stamps it on each
event it publishes (:class:`~remediation.domain.events.Fence`). The ingest, which reads the stream in
order and records into Postgres, keeps the highest token it has seen per lock and drops every event
that carries a lower one: once a newer leader's first event is recorded, nothing its predecessor
publishes afterwards counts, however long that predecessor slept.

This module is the rule alone, on plain values; :mod:`remediation.services.fencing` holds the highest
tokens in Postgres, locked for the batch, so that concurrent ingests agree.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from remediation.domain.events import NodeEvent


@dataclass
class Fenced:
    """A batch sorted by its fencing tokens: what counts, what a stale leader published, and the
    highest token per lock after the batch."""

    kept: list[NodeEvent] = field(default_factory=list)
    stale: list[tuple[NodeEvent, int]] = field(default_factory=list)  # (event, the token it is below)
    highest: dict[str, int] = field(default_factory=dict)


def sort_by_fence(events: Sequence[NodeEvent], highest: Mapping[str, int]) -> Fenced:
    """Walk ``events`` in stream order: an event without a fence is kept (no leader published it); one
    whose token is below the highest seen for its lock, in ``highest`` or earlier in the batch, is
    stale; any other is kept and may raise the highest."""
    out = Fenced(highest=dict(highest))
    for event in events:
        fence = event.fence
        if fence is None:
            out.kept.append(event)
            continue
        seen = out.highest.get(fence.lock, 0)
        if fence.token < seen:
            out.stale.append((event, seen))
            continue
        out.highest[fence.lock] = fence.token
        out.kept.append(event)
    return out
