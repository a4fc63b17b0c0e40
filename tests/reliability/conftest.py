"""The reliability and operator-trust suite: each scenario is a test marked
``@pytest.mark.scenario(name)`` whose row of the table is built by tests/scenario_table.py from the
tests' outcomes and what they measured (``scenario_figures``).

The scale of the long scenarios comes from ``REMEDIATION_RELIABILITY_SCALE``: ``ci`` (default,
shortened so the suite fits in CI) or ``full`` (the sizes the issue names).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.haproc import SentinelSet, StandbyPair
from tests.infra import missing
from tests.redisproc import RedisMissing
from tests.scenario_table import Figures

FULL = os.environ.get("REMEDIATION_RELIABILITY_SCALE", "ci") == "full"

Recorder = Figures  # the type the scenarios annotate their ``scenario_figures`` fixture with


def scale(ci: int, full: int) -> int:
    """A size for this run: ``full`` when asked for, else the CI size."""
    return full if FULL else ci


@pytest.fixture
def sentinels(tmp_path: Path) -> Iterator[SentinelSet]:
    try:
        cluster = SentinelSet(tmp_path / "redis")
    except RedisMissing:
        missing("redis-server and redis-sentinel")
    yield cluster
    cluster.stop()


@pytest.fixture
def standby_pair() -> Iterator[StandbyPair]:
    pair = StandbyPair()
    try:
        yield pair
    finally:
        pair.destroy()
