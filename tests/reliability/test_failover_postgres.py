"""Postgres loses its primary mid-workflow; its synchronous replica is promoted; every remediation
completes with each action exactly once.

A primary and a streaming replica made with ``pg_basebackup`` (:class:`tests.haproc.StandbyPair`),
synchronous commit to the replica; the workers and the test reach them through one multi-host URL with
``target_session_attrs=read-write``. The primary is stopped with ``-m immediate`` while VM restarts are
in flight, and the replica is promoted once a sweep failed on the lost primary.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from tests.haproc import StandbyPair
from tests.reliability.conftest import Recorder
from tests.reliability.test_restarts import outage_mid_workflow


@pytest.mark.scenario("Postgres failover mid-workflow (promote)")
def test_postgres_failover_mid_workflow_completes_every_remediation_once(
    standby_pair: StandbyPair, redis_prefix: str, tmp_path: Path, scenario_figures: Recorder
) -> None:
    """The workers and the test read and write through the same two-host URL; the replica is promoted
    once a sweep failed on the lost primary."""
    outage_mid_workflow(
        standby_pair.url,
        redis_prefix,
        tmp_path,
        scenario_figures,
        standby_pair.crash_primary,
        standby_pair.promote,
        lambda in_flight, down_at, up_at: (
            f"pg_ctl -m immediate on the primary with steps in flight "
            f"{sorted(Counter(in_flight.values()).items())}; replica promoted {up_at - down_at:.1f}s later; "
            f"synchronous replication; recovery = promotion to all 6 succeeded"
        ),
        REMEDIATION_DATABASE__CONNECT_TIMEOUT_S="2",
    )
