"""Batch writes of the ingest path, one statement per batch however many rows.

On Postgres each batch is one short, constant statement whose columns travel as arrays through
``unnest``; other databases (SQLite, the embedded default) take the portable SQLAlchemy form, which
gives the same rows.

Why: docs/architecture.md#the-ingest-writes-a-batch-as-one-statement
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, DateTime, String, Text, bindparam, text, update
from sqlalchemy.dialects import sqlite
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.orm import Session

from remediation.db.models import Event, Node
from remediation.db.scope import cluster_of

_TEXT = ARRAY(Text)
_TIME = ARRAY(DateTime(timezone=True))

_INSERT_EVENTS = text(
    "INSERT INTO events (cluster, dedupe_key, source, node, kind, state, reason, reason_user, observed_at, "
    "published_at, received_at, decision, decision_reason) "
    "SELECT :cluster, k, s, n, kd, st, r, ru, o, p, :received_at, '', '' "
    "FROM unnest(:k, :s, :n, :kd, :st, :r, :ru, :o, :p) AS t(k, s, n, kd, st, r, ru, o, p) "
    "ON CONFLICT (cluster, dedupe_key) DO NOTHING RETURNING id, dedupe_key"
).bindparams(
    *(bindparam(name, type_=_TEXT) for name in ("k", "s", "n", "kd", "st", "r", "ru")),
    bindparam("o", type_=_TIME), bindparam("p", type_=_TIME),
    bindparam("received_at", type_=DateTime(timezone=True)), bindparam("cluster", type_=String),
)

_SET_DECISIONS = text(
    "UPDATE events SET decision = t.d, decision_reason = t.dr, remediation_id = t.rid "
    "FROM unnest(:id, :d, :dr, :rid) AS t(id, d, dr, rid) WHERE events.id = t.id"
).bindparams(
    bindparam("id", type_=ARRAY(BigInteger)), bindparam("d", type_=_TEXT), bindparam("dr", type_=_TEXT),
    bindparam("rid", type_=ARRAY(BigInteger)),
)

_UPDATE_NODES = text(
    "UPDATE nodes SET status = t.st, status_reason = t.r, updated_at = t.u, last_event_at = t.l "
    "FROM unnest(:n, :st, :r, :u, :l) AS t(n, st, r, u, l) WHERE nodes.cluster = :cluster AND nodes.name = t.n"
).bindparams(
    bindparam("n", type_=ARRAY(String)), bindparam("st", type_=_TEXT), bindparam("r", type_=_TEXT),
    bindparam("u", type_=_TIME), bindparam("l", type_=_TIME),
)

_ENSURE_NODES = text(
    "INSERT INTO nodes (cluster, name, status, status_reason, first_seen_at, updated_at) "
    "SELECT :cluster, n, :status, '', :now, :now FROM unnest(:n) AS t(n) ON CONFLICT (cluster, name) DO NOTHING"
).bindparams(bindparam("n", type_=ARRAY(String)), bindparam("now", type_=DateTime(timezone=True)))

EVENT_COLUMNS = ("dedupe_key", "source", "node", "kind", "state", "reason", "reason_user", "observed_at",
                 "published_at")


def _postgres(session: Session) -> bool:
    return session.get_bind().dialect.name == "postgresql"


def insert_events(session: Session, rows: Sequence[dict[str, Any]], received_at: datetime) -> dict[str, int]:
    """Insert events (dicts with :data:`EVENT_COLUMNS`), skipping keys already recorded; returns
    {dedupe_key: id} of the rows inserted now."""
    if not rows:
        return {}
    if _postgres(session):
        columns = {short: [r[col] for r in rows] for short, col in zip(
            ("k", "s", "n", "kd", "st", "r", "ru", "o", "p"), EVENT_COLUMNS, strict=True)}
        result = session.execute(_INSERT_EVENTS, {**columns, "received_at": received_at,
                                                  "cluster": cluster_of(session)})
    else:
        ins = sqlite.insert(Event).on_conflict_do_nothing(index_elements=["cluster", "dedupe_key"])
        values = [{**r, "received_at": received_at, "decision": "", "decision_reason": ""} for r in rows]
        result = session.execute(ins.returning(Event.id, Event.dedupe_key), values)
    return {key: int(eid) for eid, key in result.all()}


def set_decisions(session: Session, decisions: Sequence[dict[str, Any]]) -> None:
    """Write each event's decision: dicts of id, decision, decision_reason, remediation_id."""
    if not decisions:
        return
    if _postgres(session):
        session.execute(_SET_DECISIONS, {
            "id": [d["id"] for d in decisions], "d": [d["decision"] for d in decisions],
            "dr": [d["decision_reason"] for d in decisions], "rid": [d["remediation_id"] for d in decisions],
        })
    else:
        session.execute(update(Event), list(decisions))


def ensure_nodes(session: Session, names: Sequence[str], status: str, *, now: datetime) -> None:
    """Add the nodes not in the inventory yet (``status``, first seen ``now``); existing rows untouched."""
    if not names:
        return
    if _postgres(session):
        session.execute(_ENSURE_NODES, {"n": list(names), "status": status, "now": now,
                                        "cluster": cluster_of(session)})
    else:
        session.execute(sqlite.insert(Node).on_conflict_do_nothing(index_elements=["cluster", "name"]), [
            {"name": n, "status": status, "status_reason": "", "first_seen_at": now, "updated_at": now}
            for n in names
        ])


def update_nodes(session: Session, rows: Sequence[dict[str, Any]]) -> None:
    """Write back node rows: dicts of name, status, status_reason, updated_at, last_event_at."""
    if not rows:
        return
    if _postgres(session):
        session.execute(_UPDATE_NODES, {
            "n": [r["name"] for r in rows], "st": [str(r["status"]) for r in rows],
            "r": [r["status_reason"] for r in rows], "u": [r["updated_at"] for r in rows],
            "l": [r["last_event_at"] for r in rows], "cluster": cluster_of(session),
        })
    else:
        cluster = cluster_of(session)
        session.execute(update(Node), [{"cluster": cluster, **r} for r in rows])
