"""Admission of the stream's payloads: what the ingest records, and why it keeps each one it refuses.

Every failure to parse a payload, whatever raised it, is that payload's (a ``rejected_events`` row with
the reason), never the batch's; an event that parsed is then judged by
:func:`remediation.domain.admission.admit`.

Why: docs/architecture.md#believe-nothing-unchecked
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta

from sqlalchemy.orm import Session

from remediation.db.models import RejectedEvent
from remediation.domain.admission import (
    Published,
    Publisher,
    Refusal,
    Rejection,
    Reportable,
    TimeBounds,
    admit,
    foreign_cluster,
)
from remediation.domain.events import InvalidEvent, NodeEvent
from remediation.settings import BrokerSettings

log = logging.getLogger(__name__)


def storable(text: str, limit: int = 65536) -> str:
    """Text as Postgres can keep it: NUL is the one character a text column refuses, and one
    unstorable payload must never fail (and so block) the batch it arrived in."""
    return text[:limit].replace("\x00", "\\u0000")


_NODE_FIELD = re.compile(rb'"node"\s*:\s*"([^"]{1,253})"')


def oversize(raw: str | bytes, max_bytes: int | None) -> str | None:
    """Why ``raw`` is too large to record (None: it is not). Rejected whole, never cut to fit: a log
    line names the node and the size, and the rejected_events row says the same."""
    data = raw if isinstance(raw, bytes) else raw.encode("utf-8", "replace")
    if max_bytes is None or len(data) <= max_bytes:
        return None
    found = _NODE_FIELD.search(data[:4096])
    node = found.group(1).decode("utf-8", "replace") if found else "unknown"
    log.warning(
        "rejected an event for node %s: %d bytes, over broker.max_event_bytes (%d)",
        node,
        len(data),
        max_bytes,
    )
    return f"oversize: {len(data)} bytes for node {node}, over broker.max_event_bytes ({max_bytes})"


def _text(raw: str | bytes) -> str:
    return raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)


#: An event, the publisher whose stream it was read from, and that stream's cluster (None, None: not read
#: from a stream).
Parsed = tuple[NodeEvent, Publisher | None, str | None]


def parse_payloads(
    payloads: Sequence[str | bytes], max_bytes: int | None = None
) -> tuple[list[Parsed], list[tuple[str, str]]]:
    """The payloads that are events, each with the publisher whose stream it came from (a
    :class:`~remediation.domain.admission.Published` payload names it; any other has none), and
    (payload, why) of each one that is not. Every failure to parse is the payload's, never the
    batch's: one value no converter can take (a time that overflows in UTC) costs its own payload a
    ``rejected_events`` row, and the rest of the batch is recorded."""
    events: list[Parsed] = []
    rejected: list[tuple[str, str]] = []
    for raw in payloads:
        if (too_large := oversize(raw, max_bytes)) is not None:
            rejected.append((storable(_text(raw)), too_large))
            continue
        try:
            where = (raw.publisher, raw.cluster) if isinstance(raw, Published) else (None, None)
            events.append((NodeEvent.parse(raw), *where))
        except InvalidEvent as exc:
            rejected.append((storable(_text(raw)), storable(str(exc), 4000)))
        except Exception as exc:  # noqa: BLE001 - the payload is the publisher's word; nothing in it may fail the batch
            why = Rejection(Refusal.UNPARSEABLE, f"{type(exc).__name__}: {exc}")
            rejected.append((storable(_text(raw)), storable(str(why), 4000)))
    return events, rejected


def admit_events(
    events: Sequence[Parsed],
    now: datetime,
    bounds: TimeBounds | None,
    *,
    counters: Mapping[str, int] | None = None,
    reportable: Reportable | None = None,
) -> tuple[list[NodeEvent], list[tuple[str, str]]]:
    """The events their publishers may report (:func:`remediation.domain.admission.admit`), and
    (payload, why) of each one refused. ``counters``: each lock's fencing-token counter in Redis;
    ``reportable``: the facts each publisher may report."""
    kept: list[NodeEvent] = []
    refused: list[tuple[str, str]] = []
    for event, publisher, cluster in events:
        verdict = foreign_cluster(event, cluster) or admit(event, now, bounds, publisher=publisher,
                                                           counters=counters, reportable=reportable)
        if isinstance(verdict, Rejection):
            log.warning("refused an event for node %s from the stream: %s", event.node, verdict.refusal.value)
            refused.append((storable(event.to_json()), storable(str(verdict), 4000)))
        else:
            kept.append(verdict)
    return kept, refused


def reject(session: Session, payload: str | bytes, error: str, *, now: datetime) -> None:
    """Keep a payload that could not be recorded (the last resort of the ingest task)."""
    session.add(RejectedEvent(received_at=now, payload=storable(_text(payload)), error=storable(error, 4000)))


def time_bounds(broker: BrokerSettings) -> TimeBounds:
    """How far the ingest lets an event's timestamps be from its own clock (``broker.max_clock_skew_s``
    ahead, ``broker.max_event_age_s`` behind)."""
    return TimeBounds(
        skew=timedelta(seconds=broker.max_clock_skew_s), age=timedelta(seconds=broker.max_event_age_s)
    )
