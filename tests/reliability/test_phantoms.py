"""Scenario "false quarantines": continuous fault replay, every quarantine against the injector's log.

See :mod:`tests.reliability.phantoms`. At CI scale 16 nodes take faults for 90 s with a fault every
4 s on average (storms every 45 s); ``--full`` is the soak of the issue, 32 nodes for 10 minutes at
the replay's default pace (also ``python -m bench.phantom_soak``). The figure recorded is the number
of false quarantines (the goal is 0), with the faults seen and the remediations they needed.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from tests.conftest import REDIS_URL
from tests.reliability.conftest import FULL, Recorder, scale
from tests.reliability.phantoms import soak


@pytest.mark.scenario("false quarantines (phantom-fault soak)")
def test_no_quarantine_without_its_faults_behind_it(
    pg_url: str, redis_client: redis.Redis, redis_prefix: str, tmp_path: Path, scenario_figures: Recorder
) -> None:
    r = soak(scale(16, 32), scale(90, 600), pg_url, REDIS_URL, redis_prefix, tmp_path,
             mean_gap_s=20.0 if FULL else 4.0, storm_every_s=240.0 if FULL else 45.0, seed=22)
    scenario_figures.record(
        duplicate_actions=r.extra_remediations,
        notes=f"{len(r.false_quarantines)} false quarantine(s) of {r.quarantines}; {r.faults} faults injected on "
        f"{r.faulted_nodes}/{r.nodes} nodes in {r.duration_s:.0f}s ({r.by_kind}); {r.remediations} remediations; "
        f"decisions {r.decisions}; runs = quarantines, dup. actions = remediations beyond their node's faults",
        extra={"false_quarantines": len(r.false_quarantines), "faults": r.faults},
    )
    assert r.faults > 0 and r.remediations > 0
    assert r.false_quarantines == []
    assert r.extra_remediations == 0
    assert r.open_at_end == 0
