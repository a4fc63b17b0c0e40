"""Scenario "false positives": what is no fault, beside real faults; every action against the injector's log.

See :mod:`tests.reliability.false_positives`. At CI scale 8 nodes run for 45 s: 4 take the fault
replay (a fault every 6 s on average), 4 only noise (a signal every 4 s each, slurmctld stalling every
15 s); ``--full`` is ``python -m bench.false_positives``'s size. The service must act on no noise-only
node, and the noise must really have been seen: the application XIDs and maintenance drains decided by
the ingest, the stalls by the Slurm watcher, all after the barrier.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from tests.conftest import REDIS_URL
from tests.reliability.conftest import FULL, Recorder, scale
from tests.reliability.false_positives import IGNORED, soak


# Above the sum of the waits inside (start 150 s, barrier 120 s, settle 120 s, the soak): a loaded runner
# then fails on the wait that ran out, with its processes' output, not on pytest's timeout. The remediations
# of the faulted half may take minutes to close when the whole suite shares two cores.
@pytest.mark.timeout(480)
@pytest.mark.scenario("false positives (noise soak)")
def test_no_action_on_a_node_that_had_no_fault(
    pg_url: str, redis_client: redis.Redis, redis_prefix: str, tmp_path: Path, scenario_figures: Recorder
) -> None:
    r = soak(scale(8, 32), scale(45, 600), pg_url, REDIS_URL, redis_prefix, tmp_path,
             mean_gap_s=20.0 if FULL else 4.0, fault_gap_s=20.0 if FULL else 6.0,
             stall_every_s=60.0 if FULL else 15.0, seed=7, quiesce_s=120.0)
    scenario_figures.record(
        duplicate_actions=r.false_actions,
        notes=f"{len(r.false_remediations)} false remediation(s) in {r.signals} noise signals ({r.noise}, "
        f"{r.own_machine_actions} own machine actions) on {len(r.noise_nodes)}/{r.nodes} nodes in {r.duration_s:.0f}s "
        f"beside {r.faults} faults; decided on noise nodes {r.reached}; barrier {r.barrier_s:.1f}s; "
        "dup. actions = actions on nodes with no fault",
        extra={"false_remediations": len(r.false_remediations), "signals": r.signals},
    )
    # The noise was injected, and reached what it should: the ingest decided each application XID and
    # maintenance drain (held past their thresholds), the Slurm watcher failed its reads in the stalls.
    assert r.noise.get("app_xid", 0) >= 2 and r.noise.get("human_drain", 0) >= 1, r.noise
    assert r.noise.get("slurmctld_stall", 0) >= 1 and r.stall_reads_failed >= 1
    assert sum(n for k, n in r.noise.items() if k not in ("app_xid", "human_drain", "slurmctld_stall")) >= 4
    assert r.reached.get("app_xid", 0) >= r.noise["app_xid"], r.reached
    assert r.reached.get(IGNORED, 0) >= r.noise["human_drain"], r.reached
    assert r.faults > 0 and r.remediations > 0  # the service was busy with real faults meanwhile
    assert r.false_remediations == [] and r.false_actions == 0 and r.sim_actions == 0
    assert r.open_at_end == 0
