"""Topology-correlated incidents on the real slurmctld: topology.conf -> domains -> one incident.

The topology cluster (conftest.py ``slurm_topo``; ``scripts/slurm-up.sh`` SLURM_CI_LEAVES) has
``TopologyPlugin=topology/tree`` with two leaf switches, leaf0 = gpu-node-[0-1] and leaf1 =
gpu-node-[2-3], under one spine.
The real Slurm watcher reads ``scontrol show topology`` and publishes each node's domains; the real
ingest records them and, when both nodes of leaf0 go DOWN at once, opens ONE incident: both are
drained in Slurm, neither gets a VM action, on-call is paged once, and neither counts as a repeat
offender. A node of leaf1 failing alone meanwhile is remediated normally (with its VM restart).
Driven like test_slurm_workflow.py: watcher thread, Redis stream, ingest and engine in this process.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from remediation.adapters.memory import MemoryWorld
from remediation.clock import SystemClock
from remediation.db.models import AuditLog, Incident, NodeDomain, Remediation
from remediation.db.queries import recent_failure_counts
from remediation.domain.states import AuditAction
from remediation.incidents import service as incidents
from remediation.ports.dispatch import FollowUp
from remediation.services.workflow import RetryLater
from tests.integration.slurm.conftest import SlurmCluster
from tests.integration.slurm.test_slurm_workflow import (
    FULL_RUN,
    PREFIX,
    Pipeline,
    SlurmdRestartVM,
    make_settings,
    rems_of,
    steps_of,
    wait_idle,
)
from tests.pace import within

INCIDENT_ACTIONS = (AuditAction.INCIDENT_OPENED, AuditAction.INCIDENT_JOINED, AuditAction.INCIDENT_RECOVERED,
                    AuditAction.INCIDENT_RESOLVED)

pytestmark = pytest.mark.slurm

LEAF0 = ["gpu-node-0", "gpu-node-1"]
ALONE = "gpu-node-2"  # on leaf1


@pytest.fixture
def pipeline(
    slurm_topo: SlurmCluster, redis_client: redis.Redis, redis_prefix: str, sessions: sessionmaker[Session]
) -> Iterator[Callable[..., Pipeline]]:
    made: list[SlurmdRestartVM] = []

    def make(**incident: Any) -> Pipeline:
        world = MemoryWorld(nodes=slurm_topo.nodes)
        made.append(SlurmdRestartVM(world, slurm_topo))
        settings = make_settings(slurm_topo, redis_prefix)
        settings = settings.model_copy(update={"incidents": settings.incidents.model_copy(update=incident)})
        return Pipeline(slurm_topo, settings, redis_client, sessions, world, made[-1])

    yield make
    for provider in made:
        provider.close()


def run_until(p: Pipeline, f: FollowUp, done: Callable[[], bool], timeout: float = 20) -> FollowUp | None:
    """Run one remediation's steps in real time until ``done()`` (or it closes)."""
    deadline = within(timeout)
    nxt: FollowUp | None = f
    while nxt is not None and not done():
        assert time.monotonic() < deadline, f"remediation {f.remediation_id} did not get there in {timeout}s"
        time.sleep(nxt.countdown)
        p.ingest()
        try:
            nxt = p.engine.run(nxt.remediation_id, nxt.step)
        except RetryLater as exc:
            nxt = FollowUp(f.remediation_id, f.step, exc.countdown)
    return nxt


def rem(p: Pipeline, rid: int) -> Remediation:
    with p.sessions() as s:
        found = s.get(Remediation, rid)
        assert found is not None
        return found


def test_a_whole_leaf_down_is_one_incident_and_a_lone_node_is_remediated(
    slurm_topo: SlurmCluster, pipeline: Callable[..., Pipeline]
) -> None:
    slurm = slurm_topo
    p = pipeline(min_fraction=1.0, window_s=30, vm_grace_s=1)
    with p.watching():
        # The watcher publishes the topology it read; the ingest keeps it.
        def domains() -> dict[str, dict[str, str]]:
            with p.sessions() as s:
                return incidents.domains_of(s, slurm.nodes)

        p.wait_until(lambda: len(domains()) == len(slurm.nodes), 10, "domains from scontrol show topology")
        assert domains()["gpu-node-1"] == {"leaf-switch": "leaf0", "switch": "spine"}
        assert domains()["gpu-node-3"] == {"leaf-switch": "leaf1", "switch": "spine"}

        # A human's own reason that names no known cause (class unknown: the shipped policy would restart
        # the nodes), so the incident, not the class, is what holds them. A reason naming the leaf switch
        # would be class fabric, which the shipped policy holds for a human on its own.
        slurm.scontrol("update", f"nodename={','.join(LEAF0)}", "state=down",
                       "reason=uplink of rack A cut by facilities")
        p.wait_until(lambda: len(p.opened) == 2, 5, "both nodes of leaf0 opened")
        members = p.take_opened()
        with p.sessions() as s:
            (inc,) = s.scalars(select(Incident)).all()
            pages = s.scalars(select(AuditLog).where(AuditLog.action == "incident_opened")).all()
        assert (inc.kind, inc.name, inc.status, inc.nodes, inc.domain_size) == ("leaf-switch", "leaf0", "open", LEAF0, 2)
        assert len(pages) == 1 and "leaf switch" in pages[0].reason and "gpu-node-[0-1]" in pages[0].reason

        # Each member drains (the safe step) and then waits on the incident: no eviction, no VM action.
        for f in members:
            run_until(p, f, lambda rid=f.remediation_id: "held by incident" in (rem(p, rid).wait_reason or ""))
            assert [r.step for r in steps_of(p.sessions, f.remediation_id)] == ["slurm_drain", "k8s_cordon"]
            assert rem(p, f.remediation_id).incident_id == inc.id
        now = slurm.nodes_now()
        for node in LEAF0:
            state, flags, reason = now[node]
            assert "DRAIN" in flags and reason.startswith(PREFIX), now[node]

        # A node of the other leaf failing alone is remediated on its own, VM restart included.
        slurm.scontrol("update", f"nodename={ALONE}", "state=fail", "reason=xid 79")
        p.wait_until(lambda: len(p.opened) == 1, 5, "the lone failure opened")
        (alone,) = p.take_opened()
        p.settle([alone])
        (alone_rem,) = rems_of(p.sessions, ALONE)
        assert (alone_rem.status, alone_rem.incident_id) == ("succeeded", None)
        assert [r.step for r in steps_of(p.sessions, alone_rem.id)] == FULL_RUN
        assert [n for n, _ in p.vm.revived] == [ALONE]  # type: ignore[attr-defined]

        # A DOWN a human set with their own reason: Slurm cannot show it ended, so the incident stays
        # open (the sweeper's check had its chance) until a human resolves it.
        assert incidents.check_recovery(p.sessions, p.adapters, p.settings, clock=SystemClock()) == []
        with p.sessions() as s, s.begin():
            released = incidents.resolve(s, inc.id, "alice", reason="leaf0 uplink replaced",
                                         now=SystemClock().now())
        assert sorted(f.remediation_id for f in released) == sorted(f.remediation_id for f in members)
        p.settle(released)
        for node in LEAF0:
            (member,) = rems_of(p.sessions, node)
            assert member.status == "cancelled" and "incident" in (member.outcome or ""), member.outcome
            assert "vm_restart" not in [r.step for r in steps_of(p.sessions, member.id)]
            wait_idle(slurm, node)
        assert [n for n, _ in p.vm.revived] == [ALONE]  # type: ignore[attr-defined]
        with p.sessions() as s:
            assert s.get(Incident, inc.id).status == "resolved"  # type: ignore[union-attr]
            counted = recent_failure_counts(s, slurm.nodes, SystemClock().now(),
                                            window=p.settings.policy.repeat_offender_window)
            assert counted == {ALONE: 1}  # the incident's nodes are no repeat offenders
            assert s.scalar(select(func.count()).select_from(NodeDomain)) == 2 * len(slurm.nodes)
            actions = [a for (a,) in s.execute(select(AuditLog.action).where(AuditLog.action.in_(INCIDENT_ACTIONS)))]
        assert actions == ["incident_opened", "incident_resolved"]
