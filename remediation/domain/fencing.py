"""Fencing: a leader's events count only until a newer leader has published.

Every leader lock holder stamps its fencing token on the events it publishes; the ingest keeps the
highest token it has seen per lock and drops every event carrying a lower one. This module is the rule
alone, on plain values; :mod:`remediation.services.fencing` holds the highest tokens in Postgres.

Why: docs/architecture.md#past-one-machine-failover-loses-nothing-and-a-leader-cannot-be-two
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
