"""Bad events on the real Redis stream, taken by the real ingest into Postgres: each is kept in
rejected_events with the reason it was refused, and the good events published around it are all
recorded. Each bad input is a row of the security section (tests/scenario_table.py)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
import redis
from sqlalchemy import create_engine, select
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import NullPool

from remediation.adapters.bus import RedisEventBus
from remediation.adapters.stream import Reading, consume
from remediation.clock import SystemClock
from remediation.db.models import Event, RejectedEvent
from remediation.domain.events import EventKind, NodeEvent, Source
from remediation.services.ingest import StreamChecks, ingest_batch
from remediation.services.payloads import time_bounds
from remediation.settings import Settings
from tests.scenario_table import FORGED, HUGE_EVENT, MALFORMED, NODE_NAME, BadInputs


def event(node: str, reason: str = "xid 79") -> NodeEvent:
    return NodeEvent(
        source=Source.SLURM,
        node=node,
        kind=EventKind.UNHEALTHY,
        state="FAIL",
        reason=reason,
        observed_at=datetime.now(UTC),
    )


def raw(node: str, reason: str = "xid 79", **fields: str) -> str:
    return json.dumps(
        {
            "source": "slurm",
            "node": node,
            "kind": "unhealthy",
            "state": "FAIL",
            "reason": reason,
            "observed_at": datetime.now(UTC).isoformat(),
            **fields,
        }
    )


def at(**delta: float) -> str:
    return (datetime.now(UTC) + timedelta(**delta)).isoformat()


BAD = [
    (MALFORMED, "not JSON", "{not json"),
    (MALFORMED, "JSON, not an object", "[1, 2, 3]"),
    (MALFORMED, "an unknown kind", '{"source": "slurm", "node": "gpu-node-1", "kind": "exploded"}'),
    (MALFORMED, "NUL bytes in the payload", '{"source": "slurm\x00", "node": "gpu-node-1\x00"}'),
    (HUGE_EVENT, "a 100 KiB reason", raw("gpu-node-1", "x" * 100_000)),
    (HUGE_EVENT, "a 4 MiB payload", "{" + '"pad": "' + "y" * (4 << 20) + '"}'),
    (NODE_NAME, "a 254-character node name", raw("n" * 254)),
    (NODE_NAME, "a node name with a shell command", raw("gpu-node-1;rm -rf /")),
    (NODE_NAME, "a node name with a newline", raw("gpu-node-1\nDOWN")),
    (NODE_NAME, "a hostlist for a node name", raw("gpu-node-[1-99]")),
    (NODE_NAME, "a non-ASCII node name", raw("gpu-nöde-1")),
    (MALFORMED, "a time that overflows in UTC", raw("gpu-node-1", observed_at="9999-12-31T23:59:59-01:00")),
    (MALFORMED, "the first instant, west of UTC", raw("gpu-node-1", observed_at="0001-01-01T00:00:00+01:00")),
    (FORGED, "observed a day in the future", raw("gpu-node-1", observed_at=at(days=1))),
    (FORGED, "a condition begun a day in the future", raw("gpu-node-1", since=at(days=1))),
    (FORGED, "observed a year ago", raw("gpu-node-1", observed_at=at(days=-365))),
    (FORGED, "a manual report", raw("gpu-node-1", source="manual")),
]


@pytest.mark.parametrize(("kind", "what", "payload"), BAD, ids=[what for _, what, _ in BAD])
def test_a_bad_event_on_the_stream_is_kept_as_rejected_and_nothing_else_is_lost(
    redis_client: redis.Redis,
    redis_prefix: str,
    pg_url: str,
    bad_inputs: BadInputs,
    kind: str,
    what: str,
    payload: str,
) -> None:
    bus = RedisEventBus(redis_client, redis_prefix)
    good = [event(f"gpu-node-{i}") for i in range(1, 4)]
    bus.publish(good[:1])
    bus.publish_raw(payload)
    bus.publish(good[1:])
    engine = create_engine(pg_url, poolclass=NullPool)
    sessions = sessionmaker(engine)
    settings = Settings()

    def handle(payloads: list[bytes]) -> None:  # type: ignore[type-arg]
        # As the ingest task calls it: with the shipped bounds on a payload's size and its times.
        ingest_batch(sessions, payloads, settings.policy, clock=SystemClock(),
                     checks=StreamChecks(max_bytes=settings.broker.max_event_bytes,
                                         bounds=time_bounds(settings.broker)))

    try:
        handled = consume(redis_client, bus.keys, handle, reading=Reading(batch=100, claim_idle_ms=0))
        with Session(engine) as s:
            rejected = s.scalars(select(RejectedEvent)).all()
            kept = set(s.scalars(select(Event.dedupe_key)))
    finally:
        engine.dispose()
    lost = len({e.dedupe_key for e in good} - kept)
    assert handled == 4 and redis_client.xlen(bus.keys.stream) == 0
    assert len(rejected) == 1, [r.error for r in rejected]
    (row,) = rejected
    assert row.payload and row.error
    # A huge event is refused for its size, whole, and the record says so; it is never parsed or cut.
    assert row.error.startswith("oversize: ") is (kind == HUGE_EVENT), row.error
    first_line = row.error.splitlines()[0][:90]
    cut = f", its first {len(row.payload):,} characters" if len(row.payload) < len(payload) else ""
    bad_inputs.tried(
        kind,
        f"event on the stream, {what}",
        f"rejected, kept in rejected_events{cut} ({first_line})",
        lost=lost,
    )
    assert lost == 0
