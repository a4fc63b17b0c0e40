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

import httpx
import pytest
from sqlalchemy import create_engine, select
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from remediation.db.models import AuditLog
from tests.conftest import REDIS_URL
from tests.haproc import StandbyPair
from tests.integration.apiproc import ApiProcess, base_env
from tests.reliability.conftest import Recorder
from tests.reliability.test_restarts import outage_mid_workflow

ADMIN_TOKEN = "failover-test-admin-token-0123456789abcdef"


@pytest.mark.scenario("Postgres failover mid-workflow (promote)")
def test_postgres_failover_mid_workflow_completes_every_remediation_once(
    standby_pair: StandbyPair, redis_prefix: str, tmp_path: Path, scenario_figures: Recorder
) -> None:
    """The workers, an API replica and the test read and write through the same two-host URL; the
    replica is promoted once a sweep failed on the lost primary. The API served a page before the
    failover (its pool holds connections to the old primary) and takes an on-call lever after it."""
    api = ApiProcess(base_env(standby_pair.url, REMEDIATION_BROKER__REDIS_URL=REDIS_URL,
                              REMEDIATION_BROKER__KEY_PREFIX=redis_prefix,
                              REMEDIATION_API__ADMIN_TOKENS=f'["{ADMIN_TOKEN}"]',
                              REMEDIATION_DATABASE__CONNECT_TIMEOUT_S="2"), tmp_path / "api.log")
    auth = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    try:
        api.wait_ready()
        assert httpx.get(f"{api.url}/api/v1/overview", headers=auth, timeout=10).status_code == 200
        failover(standby_pair, redis_prefix, tmp_path, scenario_figures)
        # A write through the API after the failover: it reconnected to the promoted replica.
        for lever in ("pause", "resume"):
            r = httpx.post(f"{api.url}/api/v1/{lever}", json={"reason": "after the failover"}, headers=auth,
                           timeout=30)
            assert r.status_code == 200, r.text
    finally:
        api.stop()
    db = create_engine(standby_pair.url, poolclass=NullPool)
    with Session(db) as s:
        actions = s.scalars(select(AuditLog.action).where(AuditLog.reason == "after the failover")).all()
    db.dispose()
    assert sorted(actions) == ["pause", "resume"], actions


def failover(standby_pair: StandbyPair, redis_prefix: str, tmp_path: Path, scenario_figures: Recorder) -> None:
    outage_mid_workflow(
        standby_pair.url,
        redis_prefix,
        tmp_path,
        scenario_figures,
        standby_pair.crash_primary,
        standby_pair.promote,
        lambda in_flight, down_at, up_at, succeeded: (
            f"pg_ctl -m immediate on the primary with steps in flight "
            f"{sorted(Counter(in_flight.values()).items())}; replica promoted {up_at - down_at:.1f}s later; "
            f"synchronous replication; recovery = promotion to all {succeeded} succeeded"
        ),
        REMEDIATION_DATABASE__CONNECT_TIMEOUT_S="2",
    )
