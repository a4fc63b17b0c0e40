"""Admission: what an event read from the stream may claim, judged before it is recorded.

The stream is a trust boundary (docs/architecture.md, "Believe nothing unchecked"): a watcher's
credential reports what its own source saw, nothing more. So an event read from it is refused when it
claims to be a human's report (``source: manual``; humans report through the API or the CLI, which
record the actor), and when its timestamps are beyond what one clock may be off from another. Freshness
is judged on the ingest's own clock: an ``observed_at`` a little ahead of it (within the skew bound) is
clamped to it, so it never counts as fresher than now.

Rules alone, on plain values; :mod:`remediation.services.ingest` applies them to each payload.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from remediation.domain.events import NodeEvent, Source


class Refusal(StrEnum):
    """Why an event from the stream is not recorded; the first word of its ``rejected_events`` row."""

    UNPARSEABLE = "unparseable"  # not a NodeEvent, however it failed
    OVERSIZE = "oversize"  # larger than broker.max_event_bytes
    MANUAL = "manual"  # a human's report, which only the API or the CLI may record
    FUTURE = "future"  # observed (or begun, or published) beyond the skew bound ahead of the ingest's clock
    STALE = "stale"  # observed longer ago than the age bound
    FOREIGN_FENCE = "foreign-fence"  # a fence of a lock its publisher may not hold
    FORGED_TOKEN = "forged-token"  # a token its lock never handed out
    UNFENCED = "unfenced"  # no fence, from a publisher whose lock hands out tokens
    UNKNOWN_PUBLISHER = "unknown-publisher"  # read from a stream no known publisher writes
    FENCED = "fenced"  # a replaced leader's


@dataclass(frozen=True)
class Rejection:
    """An event (or a payload) refused, and why: ``refusal`` is what code branches on, ``detail`` is
    for people."""

    refusal: Refusal
    detail: str

    def __str__(self) -> str:
        return f"{self.refusal.value}: {self.detail}"


@dataclass(frozen=True)
class TimeBounds:
    """How far an event's timestamps may be from the ingest's clock: ``skew`` ahead, ``age`` behind."""

    skew: timedelta
    age: timedelta


def admit(event: NodeEvent, now: datetime, bounds: TimeBounds | None) -> NodeEvent | Rejection:
    """``event`` as the ingest records it (its future timestamps clamped to ``now``), or why not.
    Without ``bounds`` the timestamps are taken as written (a rehearsal's simulated clock)."""
    if event.source is Source.MANUAL:
        return Rejection(
            Refusal.MANUAL, "a human's report comes through the API or the CLI, never the stream"
        )
    if bounds is None:
        return event
    ahead = now + bounds.skew
    for name, at in (
        ("observed_at", event.observed_at),
        ("since", event.since),
        ("published_at", event.published_at),
    ):
        if at is not None and at > ahead:
            return Rejection(
                Refusal.FUTURE,
                f"{name} {at.isoformat()} is more than {_seconds(bounds.skew)} "
                f"ahead of the ingest's clock ({now.isoformat()})",
            )
    if event.observed_at < now - bounds.age:
        return Rejection(
            Refusal.STALE,
            f"observed_at {event.observed_at.isoformat()} is more than "
            f"{_seconds(bounds.age)} before the ingest's clock ({now.isoformat()})",
        )
    clamped = {
        name: now
        for name, at in (("observed_at", event.observed_at), ("since", event.since))
        if at is not None and at > now
    }
    return event.model_copy(update=clamped) if clamped else event


def _seconds(span: timedelta) -> str:
    return f"{int(span.total_seconds())} s"
