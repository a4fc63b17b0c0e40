"""Bounded events: the stream is trimmed, never below what a consumer group still needs, and an
oversize payload is rejected with a record, never cut to fit.

Real Redis for the stream; real Postgres (rolled back) for the rejection row.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence

import pytest
import redis
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from remediation.adapters.bus import GROUP, Keys, RedisEventBus
from remediation.adapters.stream import BATCH_BYTES, PAGE, Reading, consume, ensure_group, ingest_lag, trim
from remediation.clock import SystemClock
from remediation.db.models import Event, RejectedEvent
from remediation.services.ingest import StreamChecks, ingest
from remediation.settings import Settings
from tests.integration.test_bus import events


def publish(client: redis.Redis, prefix: str, n: int) -> list[bytes]:
    bus = RedisEventBus(client, prefix)
    for i in range(n):
        bus.publish_raw(json.dumps({"i": i}))
    return [eid for eid, _ in client.xrange(Keys(prefix).stream)]


def ids(client: redis.Redis, keys: Keys) -> list[bytes]:
    return [eid for eid, _ in client.xrange(keys.stream)]


def ignore(_: Sequence[bytes]) -> None:
    return None


def test_nothing_is_trimmed_before_a_group_read_it(redis_client: redis.Redis, redis_prefix: str) -> None:
    keys = Keys(redis_prefix)
    published = publish(redis_client, redis_prefix, 20)
    assert trim(redis_client, keys, keep=0) == 0  # no group yet: nobody read anything
    ensure_group(redis_client, keys)
    read = redis_client.xreadgroup(GROUP, "c1", {keys.stream: ">"}, count=5)[0][1]
    assert trim(redis_client, keys, keep=0) == 0  # five pending, fifteen never delivered
    redis_client.xack(keys.stream, GROUP, *[eid for eid, _ in read[:3]])
    assert trim(redis_client, keys, keep=0) == 3  # only what was acknowledged
    assert ids(redis_client, keys) == published[3:]
    assert ingest_lag(redis_client, keys) == (17, 2)  # 15 undelivered + 2 pending


def test_a_group_that_read_nothing_keeps_every_entry(redis_client: redis.Redis, redis_prefix: str) -> None:
    """The ingest acknowledging its entries trims nothing another consumer group has yet to read
    (XDEL after XACK, or MAXLEN on XADD, would have dropped them)."""
    keys = Keys(redis_prefix)
    published = publish(redis_client, redis_prefix, 30)
    ensure_group(redis_client, keys)
    redis_client.xgroup_create(keys.stream, "audit", id="0")
    assert consume(redis_client, keys, ignore, reading=Reading(batch=10, claim_idle_ms=60_000,
                                                               linger_s=0)) == 30
    assert ids(redis_client, keys) == published
    audit = redis_client.xreadgroup("audit", "a1", {keys.stream: ">"}, count=12)[0][1]
    redis_client.xack(keys.stream, "audit", *[eid for eid, _ in audit])
    assert trim(redis_client, keys, keep=0) == 12 and ids(redis_client, keys) == published[12:]


@pytest.mark.parametrize("keep", [0, 10, 100], ids=["no-history", "ten", "more-than-published"])
def test_acknowledged_history_is_trimmed_to_the_bound(
    redis_client: redis.Redis, redis_prefix: str, keep: int
) -> None:
    keys = Keys(redis_prefix)
    published = publish(redis_client, redis_prefix, 50)
    assert consume(redis_client, keys, ignore, reading=Reading(batch=7, claim_idle_ms=60_000, linger_s=0,
                                                               keep=keep)) == 50
    assert ids(redis_client, keys) == published[len(published) - min(keep, 50) :]
    assert ingest_lag(redis_client, keys) == (0, 0)


def test_huge_entries_never_make_a_huge_batch(redis_client: redis.Redis, redis_prefix: str) -> None:
    """A publisher's entries just under Redis's proto-max-bulk-len (1 MiB, shipped): the ingest reads a
    page at a time and stops a batch at BATCH_BYTES, so a batch holds at most that plus one page,
    never the 500 entries of broker.ingest_batch (over 400 MiB of them)."""
    keys = Keys(redis_prefix)
    huge = b"x" * 900_000
    pipe = redis_client.pipeline(transaction=False)
    for _ in range(40):
        pipe.xadd(keys.stream, {"e": huge})
    pipe.execute()
    batches: list[int] = []
    assert consume(redis_client, keys, lambda got: batches.append(sum(map(len, got))),
                   reading=Reading(batch=500, claim_idle_ms=60_000, linger_s=0)) == 40
    assert max(batches) <= BATCH_BYTES + PAGE * len(huge), batches
    assert redis_client.xpending(keys.stream, GROUP)["pending"] == 0 and redis_client.xlen(keys.stream) == 0


def test_the_bound_never_reaches_unread_entries(redis_client: redis.Redis, redis_prefix: str) -> None:
    """Over the bound with entries unread: the history goes, the unread stay, however many."""
    keys = Keys(redis_prefix)
    published = publish(redis_client, redis_prefix, 40)
    ensure_group(redis_client, keys)
    first = redis_client.xreadgroup(GROUP, "c1", {keys.stream: ">"}, count=25)[0][1]
    redis_client.xack(keys.stream, GROUP, *[eid for eid, _ in first[:20]])  # 5 pending, 15 undelivered
    assert trim(redis_client, keys, keep=10) == 20
    assert ids(redis_client, keys) == published[20:]  # 20 left, over the bound of 10: all still needed
    assert trim(redis_client, keys, keep=30) == 0


def test_an_oversize_event_is_rejected_with_a_record(
    sessions: sessionmaker[Session], caplog: pytest.LogCaptureFixture
) -> None:
    limit = Settings().broker.max_event_bytes
    small = events(1)[0].to_json()  # gpu-node-0
    big = events(8)[7].to_json()[:-1] + ", " + json.dumps({"padding": "x" * limit})[1:]
    with caplog.at_level(logging.WARNING, logger="remediation.services.ingest"), sessions() as s, s.begin():
        result = ingest(s, [big, small], Settings().policy, clock=SystemClock(),
                        checks=StreamChecks(max_bytes=limit))
    assert (result.recorded, result.rejected) == (1, 1)
    with sessions() as s:
        (row,) = s.scalars(select(RejectedEvent))
        assert s.scalars(select(Event.node)).all() == ["gpu-node-0"]
    size = len(big.encode())
    assert row.error == f"oversize: {size} bytes for node gpu-node-7, over broker.max_event_bytes ({limit})"
    assert f"node gpu-node-7: {size} bytes" in caplog.text
