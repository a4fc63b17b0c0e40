"""Drain the event streams in batches, acknowledging entries only after they are recorded.

``consume`` reads every publisher's stream in one XREADGROUP (its own unacknowledged entries first, then
others' stale ones, then new), hands each payload over as a
:class:`~remediation.domain.admission.Published` and acknowledges after ``handle`` commits. :func:`trim`
cuts acknowledged history, never past :func:`acknowledged_floor`. :func:`wait_for_new` and
:func:`claim_kick` are the workers' side of the kick.

Why: docs/architecture.md#events-travel-on-a-redis-stream-not-one-celery-message-each
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import redis

from remediation.adapters.bus import GROUP, Keys
from remediation.domain.admission import Published

Handler = Callable[[Sequence[bytes]], None]


def ensure_group(client: redis.Redis, keys: Keys) -> None:
    """The ingest's consumer group on each stream it reads (:meth:`Keys.every_stream`)."""
    for one in keys.every_stream():
        try:
            # "0": a group created after events were published still sees them.
            client.xgroup_create(one.stream, GROUP, id="0", mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise


def consumer_name() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


#: Entries one XREADGROUP asks for, from each stream (one XAUTOCLAIM: from one stream). With Redis's
#: ``proto-max-bulk-len`` at 1 MiB (the shipped redis.conf) a page holds at most 16 MiB per stream,
#: however large the entries a publisher wrote.
PAGE = 16
#: Bytes of payload a batch stops reading at: 500 ordinary events are about 250 KiB, far below it, so it
#: only ever cuts a batch of huge entries short. A batch holds at most this plus one page.
BATCH_BYTES = 8 << 20

#: An entry as read: the stream it is on (which names its publisher), its id and its fields.
Entry = tuple[Keys, bytes, dict[bytes, bytes]]


@dataclass(frozen=True)
class Reading:
    """How :func:`consume` reads: ``batch`` entries at most per handled batch, another consumer's
    entries claimed once idle ``claim_idle_ms``, at most ``max_batches`` batches per call, ``linger_s``
    waited once for more entries, ``keep`` acknowledged entries left in each stream."""

    batch: int
    claim_idle_ms: int
    max_batches: int = 10_000
    linger_s: float = 0.02
    keep: int = 0


def consume(client: redis.Redis, keys: Keys, handle: Handler, *, reading: Reading) -> int:
    """Process everything available on every stream of ``keys``' prefix; returns how many entries
    were handled. Each payload is handed over as a :class:`Published`, naming the publisher whose
    stream it was on.

    A batch is read a :data:`PAGE` at a time, up to ``batch`` entries or :data:`BATCH_BYTES` of
    payload, whichever comes first, so that entries a publisher made huge cannot make a batch huge
    (their size is checked, and each one rejected, only once read). A short batch waits ``linger_s``
    once for more entries before it is handled: under a steady stream this turns hundreds of tiny
    transactions into a few large ones (the cost of an ingest transaction is mostly per batch, not per
    event) for 20 ms of added latency. ``keep``: the acknowledged history left in each stream
    (``broker.stream_max_len``)."""
    batch, linger_s = reading.batch, reading.linger_s
    ensure_group(client, keys)
    streams = keys.every_stream()
    me = consumer_name()
    total, recovering = 0, True
    for _ in range(reading.max_batches):
        entries = _recover(client, streams, me, idle_ms=reading.claim_idle_ms) if recovering else []
        recovering = bool(entries)
        entries = entries or _read(client, streams, me, batch=batch)
        if entries and len(entries) < batch // 4 and linger_s > 0:
            time.sleep(linger_s)
            entries += _read(client, streams, me, batch=batch - len(entries), held=_size(entries))
        if not entries:
            # Close the race with publishers: drop the kick keys, then look once more.
            client.delete(*(one.kick for one in keys.every_cluster()))
            entries = _read(client, streams, me, batch=batch)
            if not entries:
                break
        handle([Published(fields.get(b"e", b""), where.publisher, where.cluster) for where, _, fields in entries])
        for where in streams:
            if ids := [eid for at, eid, _ in entries if at == where]:
                client.xack(where.stream, GROUP, *ids)
                trim(client, where, reading.keep)
        total += len(entries)
    return total


def _size(entries: list[Entry]) -> int:
    return sum(len(fields.get(b"e", b"")) for _, _, fields in entries)


def _read(client: redis.Redis, streams: list[Keys], me: str, *, batch: int, held: int = 0) -> list[Entry]:
    """New entries, a page at a time, up to ``batch`` of them or :data:`BATCH_BYTES` with ``held``."""
    out: list[Entry] = []
    while len(out) < batch and held < BATCH_BYTES:
        page = _page(client, streams, me, count=min(PAGE, batch - len(out)))
        out += page
        held += _size(page)
        if len(page) < PAGE:
            break
    return out


def _page(client: redis.Redis, streams: list[Keys], me: str, *, count: int, after: str = ">") -> list[Entry]:
    resp: Any = client.xreadgroup(GROUP, me, {one.stream: after for one in streams}, count=count) or []
    named = {one.stream: one for one in streams}
    return [(named[_text(name)], eid, fields) for name, entries in resp for eid, fields in entries]


def _recover(client: redis.Redis, streams: list[Keys], me: str, *, idle_ms: int) -> list[Entry]:
    """A page of entries read and never acknowledged: first this consumer's own (its last batch
    failed, say the database went away mid-transaction; they are ours to record again at once, not
    after ``claim_idle_ms``), then another consumer's that sat ``idle_ms`` (it died mid-batch).
    :func:`consume` asks again until none is left."""
    mine = [(where, eid, fields) for where, eid, fields in _page(client, streams, me, count=PAGE,
                                                                 after="0") if fields]
    if mine:
        return mine
    for one in streams:
        _next, claimed, *_ = client.xautoclaim(one.stream, GROUP, me, min_idle_time=idle_ms, start_id="0-0",
                                               count=PAGE)
        if found := [(one, eid, fields) for eid, fields in claimed if fields is not None]:
            return found
    return []


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _id(value: bytes | str) -> tuple[int, int]:
    ms, _, seq = _text(value).partition("-")
    return int(ms), int(seq or 0)


def acknowledged_floor(client: redis.Redis, keys: Keys) -> str | None:
    """The lowest entry id some consumer group still needs; every entry below it was delivered to, and
    acknowledged by, every group. None when the stream has no group: nobody read anything yet, so
    nothing may go."""
    try:
        groups = client.xinfo_groups(keys.stream)
    except redis.ResponseError:  # no stream yet
        return None
    floors: list[tuple[int, int]] = []
    for group in groups:
        pending = client.xpending(keys.stream, group["name"])
        if pending["pending"]:
            floors.append(_id(pending["min"]))
        else:
            ms, seq = _id(group["last-delivered-id"])
            floors.append((ms, seq + 1))
    if not floors:
        return None
    ms, seq = min(floors)
    return f"{ms}-{seq}"


def trim(client: redis.Redis, keys: Keys, keep: int) -> int:
    """Cut the acknowledged history to the newest ``keep`` entries, never an entry at or above
    :func:`acknowledged_floor`; returns how many went. Entries ids are monotonic, so one appended
    meanwhile only lands above the cut."""
    floor = acknowledged_floor(client, keys)
    if floor is None or floor == "0-1":
        return 0
    cut = floor
    if keep > 0:
        excess = int(client.xlen(keys.stream)) - keep
        if excess <= 0:
            return 0
        # The oldest entries, up to the floor: the (excess+1)-th is the first that MAXLEN keep keeps.
        below = client.xrange(keys.stream, "-", f"({floor}", count=excess + 1)
        if len(below) > excess:
            cut = _text(below[-1][0])
    return int(client.xtrim(keys.stream, minid=cut, approximate=False))


def ingest_lag(client: redis.Redis, keys: Keys) -> tuple[int, int]:
    """(entries the ingest group has not acknowledged, of which read but not yet acknowledged), over
    every stream: the first counts both those never delivered (XINFO GROUPS' lag) and those pending."""
    waiting = pending = 0
    for one in keys.every_stream():
        try:
            groups = client.xinfo_groups(one.stream)
        except redis.ResponseError:  # no such stream yet: nothing waits on it
            continue
        mine = [group for group in groups if _text(group["name"]) == GROUP]
        if not mine:  # no group yet: every entry waits
            waiting += int(client.xlen(one.stream))
            continue
        lag = mine[0].get("lag")
        undelivered = int(lag) if lag is not None else int(client.xlen(one.stream))  # unknown: all of it
        waiting += undelivered + int(mine[0]["pending"])
        pending += int(mine[0]["pending"])
    return waiting, pending


KICK_TTL_MS = 5000


def claim_kick(client: redis.Redis, keys: Keys) -> bool:
    """Set the kick key unless it is set: True when the caller must send the ingest task (a running
    ingest deletes the key before its final read, so a kick it misses comes through here)."""
    return bool(client.set(keys.kick, "1", nx=True, px=KICK_TTL_MS))


def tail(client: redis.Redis, keys: Keys) -> dict[str, str]:
    """The id of each stream's newest entry ("0-0" where there is none)."""
    out = {}
    for one in keys.every_stream():
        newest = client.xrevrange(one.stream, count=1)
        out[one.stream] = _text(newest[0][0]) if newest else "0-0"
    return out


def wait_for_new(client: redis.Redis, keys: Keys, after: dict[str, str], *, block_ms: int) -> bool:
    """Block up to ``block_ms`` until some stream holds an entry newer than its id in ``after``."""
    return bool(client.xread({one.stream: after.get(one.stream, "0-0") for one in keys.every_stream()},
                             count=1, block=block_ms))
