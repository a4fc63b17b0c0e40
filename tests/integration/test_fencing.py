"""A leader that cannot be two, and writes that wait for a replica, on the real servers.

The leader lock's fencing tokens (remediation.adapters.lock) on the shared Redis, the ingest's fence
(remediation.services.fencing) on Postgres, ``broker.replica_acks`` against a Redis that has no
replica, an ingest consumer taking back its own unacknowledged entries, and a connection to a server
that is no longer the primary (a read-only transaction) turned into an OperationalError that empties
the pool. The failover scenarios themselves are in tests/reliability/test_failover_*.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

import pytest
import redis
from sqlalchemy import func, select, text
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker

from remediation.adapters.bus import BusUnavailable, Keys, NotLeader, RedisEventBus
from remediation.adapters.lock import LeaderLock
from remediation.adapters.stream import Reading, consume
from remediation.clock import FakeClock
from remediation.db.models import Event, LeaderFence, RejectedEvent
from remediation.db.session import make_engine
from remediation.domain.admission import Published
from remediation.domain.events import EventKind, NodeEvent, Source
from remediation.services.ingest import ingest
from remediation.services.metrics import make_registry
from remediation.settings import DatabaseSettings, PolicySettings

NOW = datetime(2026, 11, 26, 4, 0, tzinfo=UTC)


def event(node: str, key: str) -> NodeEvent:
    return NodeEvent(
        source=Source.SLURM,
        node=node,
        kind=EventKind.INVENTORY,
        state="IDLE",
        observed_at=NOW,
        dedupe_key=key,
    )


def stream(client: redis.Redis, prefix: str) -> list[bytes]:
    """Every stream's entries, each naming the publisher its stream does (as the ingest reads them)."""
    return [Published(fields[b"e"], one.publisher)
            for one in Keys(prefix).every_stream() for _id, fields in client.xrange(one.stream)]


def test_each_new_holder_draws_a_higher_token(redis_client: redis.Redis, redis_prefix: str) -> None:
    key = f"{redis_prefix}:leader:slurm"
    first, second = LeaderLock(redis_client, key), LeaderLock(redis_client, key)
    assert first.acquire_or_renew() and not second.acquire_or_renew()
    assert first.fence() is not None and second.fence() is None
    held = first.token
    assert held >= int(redis_client.time()[0]) * 1000  # never below the server's clock in ms
    assert first.acquire_or_renew() and first.token == held  # a renewal keeps the token
    first.release()
    assert second.acquire_or_renew() and second.token > held
    redis_client.set(f"{key}:token", held + 10**9)  # a counter ahead of the clock: the count goes on
    second.release()
    assert first.acquire_or_renew() and first.token == held + 10**9 + 1


def test_a_replaced_leaders_events_are_fenced_at_ingest(
    redis_client: redis.Redis, redis_prefix: str, sessions: sessionmaker[Session]
) -> None:
    """The paused leader's story, step by step: its lock expires, a standby takes it, and the old one
    (which has not renewed, so still believes it leads) publishes after the new one did."""
    key = f"{redis_prefix}:leader:slurm"
    old, new = LeaderLock(redis_client, key, ttl_s=0.2), LeaderLock(redis_client, key)
    old_bus, new_bus = RedisEventBus(redis_client, redis_prefix), RedisEventBus(redis_client, redis_prefix)
    old_bus.fenced_by(old)
    new_bus.fenced_by(new)
    assert old.acquire_or_renew()
    old_bus.publish([event("gpu-node-1", "before")])  # while it led: counts
    redis_client.delete(key)  # its TTL ran out while it was paused
    assert new.acquire_or_renew() and new.token > old.token
    new_bus.publish([event("gpu-node-2", "takeover")])
    old_bus.publish(
        [event("gpu-node-3", "stale-1"), event("gpu-node-4", "stale-2")]
    )  # woke up, still "leading"
    RedisEventBus(redis_client, redis_prefix).publish([event("gpu-node-5", "report")])  # no leader: unfenced
    with sessions() as s, s.begin():
        result = ingest(s, stream(redis_client, redis_prefix), PolicySettings(), clock=FakeClock(NOW))
    with sessions() as s:
        recorded = set(s.scalars(select(Event.dedupe_key)))
        rejected = s.scalars(select(RejectedEvent.error)).all()
        fence = s.get(LeaderFence, ("default", "slurm"))
    assert {"before", "takeover", "report"} <= recorded and not {"stale-1", "stale-2"} & recorded
    assert result.rejected == 2 and len(rejected) == 2
    assert all(f"token {old.token} after token {new.token}" in e for e in rejected), rejected
    assert fence is not None and (fence.token, fence.fenced) == (new.token, 2)
    assert make_registry(sessions).get_sample_value("remediation_fenced_events_total", {"cluster": "default", "lock": "slurm"}) == 2
    # A later batch from the old holder is fenced too: the highest token is kept in Postgres.
    with sessions() as s, s.begin():
        again = ingest(
            s,
            [event("gpu-node-6", "stale-3").model_copy(update={"fence": old.fence()}).to_json()],
            PolicySettings(),
            clock=FakeClock(NOW),
        )
    assert again.rejected == 1 and again.recorded == 0


def test_a_fenced_bus_publishes_nothing_without_its_lock(
    redis_client: redis.Redis, redis_prefix: str
) -> None:
    lock = LeaderLock(redis_client, f"{redis_prefix}:leader:kube")
    bus = RedisEventBus(redis_client, redis_prefix)
    bus.fenced_by(lock)
    with pytest.raises(NotLeader):
        bus.publish([event("gpu-node-1", "x")])
    assert stream(redis_client, redis_prefix) == []


def test_without_the_replicas_asked_for_nothing_counts_as_written(
    redis_client: redis.Redis, redis_prefix: str
) -> None:
    """The shared Redis has no replica: a publish that asks for one is refused (the watcher keeps its
    outbox and retries), and a lock whose token no replica holds is given back, not led with."""
    bus = RedisEventBus(redis_client, redis_prefix, replica_acks=1, replica_ack_timeout_ms=50)
    with pytest.raises(BusUnavailable, match="0 of 1 replica"):
        bus.publish([event("gpu-node-1", "unconfirmed")])
    lock = LeaderLock(redis_client, f"{redis_prefix}:leader:slurm", replica_acks=1, replica_ack_timeout_ms=50)
    assert not lock.acquire_or_renew() and lock.fence() is None
    assert redis_client.get(f"{redis_prefix}:leader:slurm") is None  # given back for the next try


def test_an_ingest_takes_back_its_own_unacknowledged_batch_at_once(
    redis_client: redis.Redis, redis_prefix: str
) -> None:
    """Its transaction was cut off (the database failed over): the entries stay pending, and the next
    drain by the same consumer records them without waiting out the claim's idle time."""
    RedisEventBus(redis_client, redis_prefix).publish([event(f"gpu-node-{i}", f"k{i}") for i in range(3)])
    keys, seen = Keys(redis_prefix), []

    def cut_off(batch: Sequence[bytes]) -> None:
        raise OperationalError("COMMIT", {}, Exception("server closed the connection unexpectedly"))

    with pytest.raises(OperationalError):
        consume(redis_client, keys, cut_off, reading=Reading(batch=10, claim_idle_ms=3_600_000, linger_s=0))
    assert consume(redis_client, keys, seen.extend, reading=Reading(batch=10, claim_idle_ms=3_600_000,
                                                                    linger_s=0)) == 3
    assert len(seen) == 3 and redis_client.xpending(keys.stream, "ingest")["pending"] == 0


def test_a_server_that_is_no_longer_the_primary_empties_the_pool(pg_url: str) -> None:
    """A demoted primary (here: a session that refuses writes, as a standby does) answers 25006; the
    engine takes that as a lost connection, so the next checkout connects afresh through the URL's
    hosts, and the caller sees the OperationalError it already retries."""
    engine = make_engine(DatabaseSettings(url=pg_url))
    with engine.connect() as conn:
        conn.execute(text("SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY"))
        conn.commit()
        before = conn.execute(text("SELECT pg_backend_pid()")).scalar()
        with pytest.raises(OperationalError) as caught:
            conn.execute(text("CREATE TABLE refused (x int)"))
        assert caught.value.connection_invalidated
    with engine.connect() as conn:
        assert conn.execute(text("SELECT pg_backend_pid()")).scalar() != before
        assert (
            conn.execute(select(func.count()).select_from(LeaderFence)).scalar() == 0
        )  # a fresh connection works
    engine.dispose()
