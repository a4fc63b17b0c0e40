"""Drain the event stream in batches, acknowledging entries only after they are recorded.

``drain`` reads with a consumer group: first it claims entries another consumer read but never
acknowledged (that consumer died mid-batch), then it reads new ones. ``handle`` records a batch and
commits; only then are the entries acknowledged and deleted (the database, not Redis, is the record).
If ``handle`` raises (Postgres is down), nothing is acknowledged and the entries are claimed again
later. See remediation.adapters.bus for the kick protocol that makes ``drain`` end without losing a late
event, and :func:`wait_for_new` and :func:`claim_kick` for the workers' side of it.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Sequence

import redis

from remediation.adapters.bus import GROUP, Keys

Handler = Callable[[Sequence[bytes]], None]


def ensure_group(client: redis.Redis, keys: Keys) -> None:
    try:
        # "0": a group created after events were published still sees them.
        client.xgroup_create(keys.stream, GROUP, id="0", mkstream=True)
    except redis.ResponseError as exc:
        if "BUSYGROUP" not in str(exc):
            raise


def consumer_name() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


def drain(client: redis.Redis, keys: Keys, handle: Handler, batch: int, claim_idle_ms: int,
          max_batches: int = 10_000, linger_s: float = 0.02) -> int:
    """Process everything available; returns how many entries were handled.

    A short batch waits ``linger_s`` once for more entries before it is handled: under a steady stream
    this turns hundreds of tiny transactions into a few large ones (the cost of an ingest transaction is
    mostly per batch, not per event) for 20 ms of added latency."""
    ensure_group(client, keys)
    me = consumer_name()
    total = 0
    for n in range(max_batches):
        entries = (_claim(client, keys, me, batch, claim_idle_ms) if n == 0 else []) or _read(client, keys, me, batch)
        if entries and len(entries) < batch // 4 and linger_s > 0:
            time.sleep(linger_s)
            entries += _read(client, keys, me, batch - len(entries))
        if not entries:
            # Close the race with publishers: drop the kick key, then look once more.
            client.delete(keys.kick)
            entries = _read(client, keys, me, batch)
            if not entries:
                break
        ids = [eid for eid, _ in entries]
        handle([fields.get(b"e", b"") for _, fields in entries])
        pipe = client.pipeline(transaction=False)
        pipe.xack(keys.stream, GROUP, *ids)
        pipe.xdel(keys.stream, *ids)
        pipe.execute()
        total += len(ids)
    return total


def _read(client: redis.Redis, keys: Keys, me: str, batch: int) -> list[tuple[bytes, dict[bytes, bytes]]]:
    resp = client.xreadgroup(GROUP, me, {keys.stream: ">"}, count=batch)
    return list(resp[0][1]) if resp else []


def _claim(client: redis.Redis, keys: Keys, me: str, batch: int, idle_ms: int) -> list[tuple[bytes, dict[bytes, bytes]]]:
    _next, claimed, *_ = client.xautoclaim(keys.stream, GROUP, me, min_idle_time=idle_ms, start_id="0-0", count=batch)
    return [(eid, fields) for eid, fields in claimed if fields is not None]


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


KICK_TTL_MS = 5000


def claim_kick(client: redis.Redis, keys: Keys) -> bool:
    """Set the kick key unless it is set: True when the caller must send the ingest task (a running
    ingest deletes the key before its final read, so a kick it misses comes through here)."""
    return bool(client.set(keys.kick, "1", nx=True, px=KICK_TTL_MS))


def tail(client: redis.Redis, keys: Keys) -> str:
    """The id of the stream's newest entry ("0-0" when there is none)."""
    newest = client.xrevrange(keys.stream, count=1)
    return _text(newest[0][0]) if newest else "0-0"


def wait_for_new(client: redis.Redis, keys: Keys, after: str, block_ms: int) -> bool:
    """Block up to ``block_ms`` until the stream holds an entry newer than ``after``."""
    return bool(client.xread({keys.stream: after}, count=1, block=block_ms))
