"""Drain the event stream in batches, acknowledging entries only after they are recorded.

``drain`` reads with a consumer group: first it takes back what it read itself and never acknowledged
(its last batch failed, say the database failed over mid-transaction), then it claims entries another
consumer read but never acknowledged (that consumer died mid-batch), then it reads new ones. ``handle`` records a batch and
commits; only then are the entries acknowledged (the database, not Redis, is the record). If
``handle`` raises (Postgres is down), nothing is acknowledged and the entries are claimed again later.
See remediation.adapters.bus for the kick protocol that makes ``drain`` end without losing a late
event, and :func:`wait_for_new` and :func:`claim_kick` for the workers' side of it.

**Bounded, never lossy.** After each acknowledgement :func:`trim` cuts the stream's acknowledged
history down to ``broker.stream_max_len`` entries with ``XTRIM MINID``, never past
:func:`acknowledged_floor`: the oldest entry some consumer group still needs (its oldest pending entry,
or the first one after what it was last delivered). A ``MAXLEN`` on XADD, or XDEL of what one group
acknowledged, could drop entries a group never read; this cannot. Entries nobody read stay, however
many, and :func:`ingest_lag` is what the alert on them reads.
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


#: Entries one XREADGROUP or XAUTOCLAIM asks for. With Redis's ``proto-max-bulk-len`` at 1 MiB (the
#: shipped redis.conf) one page holds at most 16 MiB, however large the entries a publisher wrote.
PAGE = 16
#: Bytes of payload a batch stops reading at: 500 ordinary events are about 250 KiB, far below it, so it
#: only ever cuts a batch of huge entries short. A batch holds at most this plus one page.
BATCH_BYTES = 8 << 20

Entry = tuple[bytes, dict[bytes, bytes]]


def drain(client: redis.Redis, keys: Keys, handle: Handler, batch: int, claim_idle_ms: int,
          max_batches: int = 10_000, linger_s: float = 0.02, keep: int = 0) -> int:
    """Process everything available; returns how many entries were handled.

    A batch is read a :data:`PAGE` at a time, up to ``batch`` entries or :data:`BATCH_BYTES` of
    payload, whichever comes first, so that entries a publisher made huge cannot make a batch huge
    (their size is checked, and each one rejected, only once read). A short batch waits ``linger_s``
    once for more entries before it is handled: under a steady stream this turns hundreds of tiny
    transactions into a few large ones (the cost of an ingest transaction is mostly per batch, not per
    event) for 20 ms of added latency. ``keep``: the acknowledged history left in the stream
    (``broker.stream_max_len``)."""
    ensure_group(client, keys)
    me = consumer_name()
    total, recovering = 0, True
    for _ in range(max_batches):
        entries = _recover(client, keys, me, claim_idle_ms) if recovering else []
        recovering = bool(entries)
        entries = entries or _read(client, keys, me, batch)
        if entries and len(entries) < batch // 4 and linger_s > 0:
            time.sleep(linger_s)
            entries += _read(client, keys, me, batch - len(entries), _size(entries))
        if not entries:
            # Close the race with publishers: drop the kick key, then look once more.
            client.delete(keys.kick)
            entries = _read(client, keys, me, batch)
            if not entries:
                break
        ids = [eid for eid, _ in entries]
        handle([fields.get(b"e", b"") for _, fields in entries])
        client.xack(keys.stream, GROUP, *ids)
        trim(client, keys, keep)
        total += len(ids)
    return total


def _size(entries: list[Entry]) -> int:
    return sum(len(fields.get(b"e", b"")) for _, fields in entries)


def _read(client: redis.Redis, keys: Keys, me: str, batch: int, held: int = 0) -> list[Entry]:
    """New entries, a page at a time, up to ``batch`` of them or :data:`BATCH_BYTES` with ``held``."""
    out: list[Entry] = []
    while len(out) < batch and held < BATCH_BYTES:
        page = _page(client, keys, me, min(PAGE, batch - len(out)))
        out += page
        held += _size(page)
        if len(page) < PAGE:
            break
    return out


def _page(client: redis.Redis, keys: Keys, me: str, count: int, after: str = ">") -> list[Entry]:
    resp = client.xreadgroup(GROUP, me, {keys.stream: after}, count=count)
    return list(resp[0][1]) if resp else []


def _recover(client: redis.Redis, keys: Keys, me: str, idle_ms: int) -> list[Entry]:
    """A page of entries read and never acknowledged: first this consumer's own (its last batch
    failed, say the database went away mid-transaction; they are ours to record again at once, not
    after ``claim_idle_ms``), then another consumer's that sat ``idle_ms`` (it died mid-batch).
    :func:`drain` asks again until none is left."""
    mine = [(eid, fields) for eid, fields in _page(client, keys, me, PAGE, after="0") if fields]
    if mine:
        return mine
    _next, claimed, *_ = client.xautoclaim(keys.stream, GROUP, me, min_idle_time=idle_ms, start_id="0-0", count=PAGE)
    return [(eid, fields) for eid, fields in claimed if fields is not None]


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
    """(entries the ingest group has not acknowledged, of which read but not yet acknowledged): the
    first counts both those never delivered (XINFO GROUPS' lag) and those pending."""
    pending = 0
    for group in client.xinfo_groups(keys.stream):
        if _text(group["name"]) != GROUP:
            continue
        pending = int(group["pending"])
        lag = group.get("lag")
        undelivered = int(lag) if lag is not None else int(client.xlen(keys.stream))  # unknown: all of it
        return undelivered + pending, pending
    return int(client.xlen(keys.stream)), 0  # no group yet: every entry waits


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
