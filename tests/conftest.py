"""Shared fixtures: real Redis keyspaces and real Postgres databases, created and dropped per run.

Servers: Redis at REMEDIATION_TEST_REDIS_URL (default redis://127.0.0.1:6379/0) and Postgres at
REMEDIATION_TEST_PG_URL (default postgresql+psycopg://postgres@127.0.0.1:5432/test, used only to
create and drop this run's own database). `.ci/run` installs and starts both when they are absent.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest
import redis

# The reliability table (tests marked @pytest.mark.scenario): see tests/scenario_table.py; the line
# naming the Slurm versions the run tested against: tests/slurm_versions.py; the policy a test runs
# under (the shipped one unless it asks for another by name, @pytest.mark.policy): tests/policies.py;
# the check that no process the session started outlives it: tests/leftovers.py; wait budgets
# stretched for a slow machine: tests/pace.py.
pytest_plugins = [
    "tests.policies", "tests.scenario_table", "tests.slurm_versions", "tests.leftovers", "tests.pace",
]

REDIS_URL = os.environ.get("REMEDIATION_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")



#: Directories and modules holding the long workflows (real processes, Slurm timeouts, soaks): they run
#: first, so that a run split over xdist workers (scripts/test.sh) ends on short modules rather than on
#: one worker finishing a long one while the others idle. A stale entry only costs balance. pytest-xdist
#: keeps this order only with --no-loadscope-reorder (pyproject.toml): by default it hands out the
#: modules with the most tests first, which put the one-test soaks last.
LONG_FIRST = (
    "tests/integration/slurm/", "tests/reliability/", "tests/integration/cloud/",
    "tests/integration/test_no_phantom_faults.py", "tests/integration/test_demo.py",
    "tests/integration/test_cli_server.py", "tests/integration/test_compose_smoke.py",
    "tests/integration/kube/", "tests/integration/test_celery_pipeline.py", "tests/integration/redfish/",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Give every test a node id of its own, and put the long modules first.

    schemathesis's per-operation tests carry their operation in their name ("test_x[GET /api/v1/nodes]")
    but, under this pytest, all share the function's node id; pytest-xdist schedules by node id and
    would run one operation of the 26."""
    for item in items:
        if item.parent is not None and item.nodeid.rpartition("::")[2] != item.name:
            item._id = item.parent.id.child(item.name)  # pytest's own rule for a child's node id

    def rank(item: pytest.Item) -> int:
        return next((i for i, d in enumerate(LONG_FIRST) if item.nodeid.startswith(d)), len(LONG_FIRST))

    items.sort(key=rank)  # stable: the order inside each group is the collection's


@pytest.fixture
def redis_client() -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(REDIS_URL)
    try:
        client.ping()
    except redis.RedisError as exc:  # pragma: no cover - environment problem
        pytest.fail(f"Redis is not reachable at {REDIS_URL}: {exc} (run .ci/run to start it)")
    yield client
    client.close()


@pytest.fixture
def redis_prefix(redis_client: redis.Redis) -> Iterator[str]:
    """A fresh key prefix for this test; every key under it is deleted afterwards."""
    prefix = f"test-{uuid.uuid4().hex[:12]}"
    yield prefix
    keys = list(redis_client.scan_iter(match=f"{prefix}*", count=1000))
    if keys:
        redis_client.delete(*keys)


# ------------------------------------------------------------------------------------------ Postgres

import psycopg  # noqa: E402
from sqlalchemy import Connection, Engine, create_engine  # noqa: E402
from sqlalchemy.orm import Session, sessionmaker  # noqa: E402
from sqlalchemy.pool import NullPool  # noqa: E402

PG_ADMIN_URL = os.environ.get("REMEDIATION_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")


def _pg_admin() -> psycopg.Connection:
    dsn = PG_ADMIN_URL.replace("postgresql+psycopg://", "postgresql://")
    try:
        return psycopg.connect(dsn, autocommit=True)
    except psycopg.OperationalError as exc:  # pragma: no cover - environment problem
        pytest.fail(f"Postgres is not reachable at {PG_ADMIN_URL}: {exc} (run .ci/run to start it)")


def _db_url(name: str) -> str:
    base, _, _ = PG_ADMIN_URL.rpartition("/")
    return f"{base}/{name}"


def _drop(name: str) -> None:
    with _pg_admin() as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def pg_template() -> Iterator[str]:
    """A database migrated with `alembic upgrade head` once per run; tests get copies of it."""
    from remediation.db.migrate import upgrade

    name = f"remtpl_{uuid.uuid4().hex[:10]}"
    with _pg_admin() as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        upgrade(_db_url(name))
        yield name
    finally:
        _drop(name)


@pytest.fixture
def pg_url(pg_template: str) -> Iterator[str]:
    """A fresh, migrated database of this test's own (for tests whose worker processes must see
    committed rows). Dropped afterwards."""
    name = f"remtest_{uuid.uuid4().hex[:10]}"
    with _pg_admin() as conn:
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{pg_template}"')
    yield _db_url(name)
    _drop(name)


@pytest.fixture(scope="module")
def pg_module_db(pg_template: str) -> Iterator[str]:
    """A fresh, migrated database for one module's long-lived processes (workers, watchers, beat):
    what they commit must not leak into ``pg_session_db``, which other tests expect clean."""
    name = f"remmod_{uuid.uuid4().hex[:10]}"
    with _pg_admin() as conn:
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{pg_template}"')
    yield _db_url(name)
    _drop(name)


@pytest.fixture(scope="session")
def pg_session_db(pg_template: str) -> Iterator[str]:
    name = f"remsess_{uuid.uuid4().hex[:10]}"
    with _pg_admin() as conn:
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{pg_template}"')
    yield _db_url(name)
    _drop(name)


@pytest.fixture
def pg_conn(pg_session_db: str) -> Iterator[Connection]:
    """A connection inside a transaction that is rolled back after the test."""
    engine = create_engine(pg_session_db, poolclass=NullPool)
    conn = engine.connect()
    outer = conn.begin()
    yield conn
    outer.rollback()
    conn.close()
    engine.dispose()


@pytest.fixture
def db(pg_url: str) -> Iterator[Engine]:
    """An engine on the test's own database holding no connection between uses: what the test reads
    while real worker processes write."""
    engine = create_engine(pg_url, poolclass=NullPool)
    yield engine
    engine.dispose()


@pytest.fixture
def sessions(pg_conn: Connection) -> sessionmaker[Session]:
    """Sessions whose commits become savepoints of the test's rolled-back transaction."""
    return sessionmaker(bind=pg_conn, expire_on_commit=False, join_transaction_mode="create_savepoint")
