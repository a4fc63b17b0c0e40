"""Shared set-up for benchmarks: a throw-away Postgres database and Redis prefix, real worker processes."""

from __future__ import annotations

import argparse
import contextlib
import os
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import psycopg
import redis

from remediation.db.migrate import upgrade

PG_ADMIN = os.environ.get("REMEDIATION_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
REDIS_URL = os.environ.get("REMEDIATION_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


@contextlib.contextmanager
def scratch_database() -> Iterator[str]:
    name = f"rembench_{uuid.uuid4().hex[:8]}"
    dsn = PG_ADMIN.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = PG_ADMIN.rpartition("/")[0] + f"/{name}"
    try:
        upgrade(url)
        yield url
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextlib.contextmanager
def scratch_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="rembench-") as d:
        yield Path(d)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    idx = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[idx]


#: Fewer samples than this and a p99 is just the maximum: it is printed as "max", never as a p99.
P99_MIN_SAMPLES = 200


def tail(values: list[float], fmt: str = "{:.2f}", unit: str = "") -> str:
    """``p99 X`` from at least 200 samples, else ``max X``."""
    if len(values) >= P99_MIN_SAMPLES:
        return f"p99 {fmt.format(percentile(values, 99))}{unit}"
    return f"max {fmt.format(max(values))}{unit}"


def tail_value(values: list[float]) -> float:
    """The value :func:`tail` prints: the p99, or the maximum of too few samples."""
    return percentile(values, 99) if len(values) >= P99_MIN_SAMPLES else max(values)


def goal(what: str, measured: str, ok: bool) -> str:
    """A goal's line: what it asks, what was measured, and its verdict, ``met`` or ``not met``.

    Every goal a benchmark names is printed through this, so RESULTS.md never names a goal without
    saying whether the run met it (tests/unit/bench/test_results.py checks the file).
    """
    return f"goal {what} ({measured}): {verdict(ok)}"


def verdict(ok: bool) -> str:
    return "met" if ok else "not met"


T = TypeVar("T")


def soak_args(description: str, *, seed: int) -> argparse.Namespace:
    """The options of a soak on the simulated cluster: ``--nodes``, ``--minutes``, ``--seed``."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--nodes", type=int, default=32)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--seed", type=int, default=seed)
    return parser.parse_args()


def soak_in_scratch(soak: Callable[..., T], args: argparse.Namespace, *, word: str, **options: Any) -> T:
    """Run ``soak`` for ``args`` on a scratch database and directory, under a Redis key prefix of its
    own (``word-<random>``), whose keys are deleted afterwards."""
    prefix = f"{word}-{uuid.uuid4().hex[:8]}"
    client = redis.Redis.from_url(REDIS_URL)
    try:
        with scratch_database() as url, scratch_dir() as work:
            return soak(args.nodes, args.minutes * 60, url, REDIS_URL, prefix, work, seed=args.seed, **options)
    finally:
        keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
        if keys:
            client.delete(*keys)
