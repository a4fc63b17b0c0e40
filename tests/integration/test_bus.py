"""Publishing pays one round trip (and so, with ``appendfsync always``, one fsync) per batch.

Real Redis; the client counts what goes over the wire: a pipeline execution is one round trip, any other
command is one more.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import redis

from remediation.adapters.bus import Keys, RedisEventBus
from remediation.domain.events import EventKind, NodeEvent, Source
from tests.conftest import REDIS_URL


class CountingPipeline(redis.client.Pipeline):  # type: ignore[misc]
    def execute(self, raise_on_error: bool = True) -> list[Any]:
        self.owner.round_trips += 1
        self.owner.commands += len(self.command_stack)
        return super().execute(raise_on_error)


class CountingRedis(redis.Redis):  # type: ignore[misc]
    round_trips = 0
    commands = 0

    def pipeline(self, transaction: bool = True, shard_hint: Any = None) -> CountingPipeline:
        pipe = CountingPipeline(self.connection_pool, self.response_callbacks, transaction, shard_hint)
        pipe.owner = self
        return pipe

    def execute_command(self, *args: Any, **options: Any) -> Any:
        self.round_trips += 1
        self.commands += 1
        return super().execute_command(*args, **options)


def events(n: int) -> list[NodeEvent]:
    now = datetime.now(UTC)
    return [NodeEvent(source=Source.SLURM, node=f"gpu-node-{i}", kind=EventKind.UNHEALTHY, state="FAIL",
                      reason="xid 79", observed_at=now) for i in range(n)]


def test_a_batch_and_its_kick_go_in_one_round_trip(redis_prefix: str) -> None:
    client = CountingRedis.from_url(REDIS_URL)
    kicks: list[int] = []
    bus = RedisEventBus(client, redis_prefix, kick=lambda: kicks.append(1))
    assert bus.publish(events(300)) == 300
    assert (client.round_trips, client.commands) == (1, 301)  # 300 XADDs and the kick's SET NX
    assert kicks == [1] and client.xlen(Keys(redis_prefix).stream) == 300
    client.round_trips = client.commands = 0
    bus.publish(events(5))  # the kick key still lives: the running ingest will see these
    assert (client.round_trips, client.commands) == (1, 6) and kicks == [1]
    bus.publish_raw("not json")
    assert client.round_trips == 2 and client.xlen(Keys(redis_prefix).stream) == 306
