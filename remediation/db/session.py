"""Engine and session set-up for Postgres (the real target) and SQLite (the embedded default).

SQLite gets WAL, a busy timeout and foreign keys, so a worker thread and the API can share the file
during the demo. Postgres connections are pre-pinged, and a server that is no longer the primary
empties the pool and reaches the caller as an ``OperationalError``, which every caller retries.
``DatabaseUnavailable`` turns "connection refused" into one clear sentence.

Why: docs/architecture.md#past-one-machine-failover-loses-nothing-and-a-leader-cannot-be-two
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event, inspect
from sqlalchemy.engine import ExceptionContext
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import StaticPool

from remediation.settings import DatabaseSettings


class DatabaseUnavailable(ConnectionError):
    """The database cannot be reached or is not migrated."""


def make_engine(cfg: DatabaseSettings) -> Engine:
    kwargs: dict[str, Any] = {"echo": cfg.echo, "pool_pre_ping": True, "future": True}
    if cfg.url.startswith("sqlite"):
        kwargs["connect_args"] = {"check_same_thread": False, "timeout": 30}
    else:
        kwargs["pool_size"] = cfg.pool_size
        kwargs["max_overflow"] = cfg.pool_size
        kwargs["connect_args"] = {"connect_timeout": cfg.connect_timeout_s}
    engine = create_engine(cfg.url, **kwargs)
    if engine.dialect.name == "sqlite":
        event.listen(engine, "connect", _sqlite_pragmas)
        event.listen(engine, "begin", _sqlite_begin_immediate)
    else:
        event.listen(engine, "handle_error", _failover_is_a_disconnect, retval=True)
    return engine


# SQLSTATEs a primary that failed over (or is failing over) answers with: read_only_sql_transaction (a
# standby, or a demoted primary), admin_shutdown, crash_shutdown, cannot_connect_now (starting up or
# in recovery).
FAILOVER_SQLSTATES = frozenset({"25006", "57P01", "57P02", "57P03"})


def _failover_is_a_disconnect(ctx: ExceptionContext) -> OperationalError | None:
    """A connection to a server that is no longer the primary is as good as lost: invalidate the pool
    (a pre-ping's ``SELECT 1`` passes on a standby, so nothing else would) and raise an
    OperationalError, which the callers retry."""
    orig = ctx.original_exception
    if getattr(orig, "sqlstate", None) not in FAILOVER_SQLSTATES:
        return None
    ctx.is_disconnect = True
    ctx.invalidate_pool_on_disconnect = True
    if isinstance(ctx.sqlalchemy_exception, OperationalError):
        return None
    return OperationalError(ctx.statement, ctx.parameters, orig, connection_invalidated=True)


def memory_engine(template: Path) -> Engine:
    """A private in-memory SQLite database holding a copy of ``template`` (a migrated database file).

    For throw-away work where durability buys nothing (the rehearsal): no file, no fsync, no WAL. One
    connection serves every session (StaticPool), so the database lives exactly as long as the engine.
    """
    conn = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
    with sqlite3.connect(template) as src:
        src.backup(conn)
    conn.execute("PRAGMA foreign_keys=ON")
    engine = create_engine("sqlite://", creator=lambda: conn, poolclass=StaticPool)
    event.listen(engine, "begin", _sqlite_begin_immediate)
    return engine


def _sqlite_begin_immediate(conn: Any) -> None:
    # SQLite ignores SELECT ... FOR UPDATE. Taking the write lock at BEGIN serialises transactions,
    # which gives the embedded mode the same read-check-write safety row locks give on Postgres.
    conn.exec_driver_sql("BEGIN IMMEDIATE")


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    dbapi_conn.isolation_level = None  # let the "begin" listener issue BEGIN itself
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA busy_timeout=30000")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.close()


def make_session_factory(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


def check_database(engine: Engine) -> None:
    """Fail with one clear sentence when the database is down or not migrated.

    A SQLite file that does not exist is not migrated, and is said so without connecting: SQLite
    creates the file it is asked to open, and a read (``remediation nodes show X`` in an empty
    directory) must leave nothing behind."""
    if _sqlite_file_missing(engine):
        raise DatabaseUnavailable(_not_migrated(engine))
    try:
        with engine.connect() as conn:
            migrated = inspect(conn).has_table("remediations")  # asked of the catalog, never read from a message
    except OperationalError as exc:
        msg = str(exc.orig).strip().splitlines()[0] if exc.orig else str(exc)
        raise DatabaseUnavailable(
            f"cannot reach database {engine.url.render_as_string(hide_password=True)}: {msg}"
        ) from None
    if not migrated:
        raise DatabaseUnavailable(_not_migrated(engine))


def _not_migrated(engine: Engine) -> str:
    url = engine.url.render_as_string(hide_password=True)
    return f"database {url} is not migrated: run `remediation db upgrade`"


def _sqlite_file_missing(engine: Engine) -> bool:
    """A SQLite URL naming a file (not ``:memory:``, not a ``file:`` URI) that is not there."""
    url = engine.url
    if url.get_backend_name() != "sqlite" or not url.database or url.database == ":memory:":
        return False
    if url.query.get("uri") or url.database.startswith("file:"):
        return False
    return not Path(url.database).exists()
