"""Two clusters in one database, on real Postgres: same node names, no shared blast radius.

Each cluster has its own in-memory world (its own Slurm, Kubernetes and machines) and its own workflow
over sessions scoped to it, as a worker builds them (``workers/context.py``). The steps are driven
synchronously; the fake clock makes windows instant. The real worker processes and two real
slurmctld are in ``tests/integration/slurm/test_slurm_clusters.py``.
"""

from __future__ import annotations

from collections import deque
from datetime import UTC, datetime

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from remediation.adapters.memory import MemoryKube, MemorySlurm, MemoryVM, MemoryWorld
from remediation.clock import FakeClock
from remediation.db.models import AuditLog, DomainRepair, Event, Incident, Node, RejectedEvent, Remediation
from remediation.db.queries import PAUSED, control_set
from remediation.db.scope import scoped
from remediation.domain.admission import Published, Publisher
from remediation.domain.events import EventKind, NodeEvent, Source
from remediation.domain.step_bodies import Adapters
from remediation.domain_repair.rules import DomainRepairStatus
from remediation.domain_repair.service import DomainRepairs
from remediation.ports.dispatch import FollowUp
from remediation.services.breaker import state as breaker_state
from remediation.services.ingest import IngestRules, ingest
from remediation.services.workflow import Workflow
from remediation.settings import Settings
from tests.faults import SOFTWARE_FAULT, show_fault

NODES = [f"gpu-node-{i}" for i in range(20)]
CLUSTERS = ("west", "east")


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(datetime(2026, 3, 1, tzinfo=UTC))


def make_settings(fleet_latch: bool = False) -> Settings:
    return Settings(
        policy={"min_restart_gap_s": 0, "breaker_min_failures": 3, "breaker_max_fraction": 0.10,
                "breaker_window_s": 600},
        workflow={"poll_interval_s": 5, "drain_timeout_s": 600, "verify_timeout_s": 120, "lease_s": 30},
        cluster={"fleet_latch": fleet_latch},
    )


class Cluster:
    """One cluster as a worker serves it: its world, its scoped sessions and its workflow."""

    def __init__(self, name: str, sessions: sessionmaker[Session], clock: FakeClock, settings: Settings) -> None:
        self.name, self.clock, self.settings = name, clock, settings
        self.world = MemoryWorld(nodes=NODES)
        self.sessions = scoped(sessions, name)
        self.engine = Workflow(self.sessions, Adapters(MemorySlurm(self.world), MemoryKube(self.world),
                                                       MemoryVM(self.world)), settings, clock=clock)

    def fail(self, node: str, *, stream: str | None = None) -> list[FollowUp]:
        """The node fails, and its watcher's event arrives on ``stream``'s Slurm stream (its own)."""
        show_fault(self.world, node, "FAIL", SOFTWARE_FAULT)
        event = NodeEvent(source=Source.SLURM, cluster=self.name, node=node, kind=EventKind.UNHEALTHY,
                          state="FAIL", reason=SOFTWARE_FAULT, observed_at=self.clock.now())
        payload = Published(event.to_json().encode(), Publisher.SLURM, stream or self.name)
        return self.ingest(payload, cluster=stream or self.name)

    def ingest(self, payload: bytes | str, *, cluster: str | None = None) -> list[FollowUp]:
        with scoped(self.sessions, cluster or self.name)() as s, s.begin():
            result = ingest(s, [payload], self.settings.policy, clock=self.clock,
                            rules=IngestRules(incidents=self.settings.incidents))
        return [FollowUp(rid, step) for rid, step in result.opened]

    def drive(self, todo: list[FollowUp], limit: int = 80) -> list[FollowUp]:
        """Run steps until none is due now; returns what waits (countdowns left unspent)."""
        queue, waiting = deque(todo), []
        for _ in range(limit):
            if not queue:
                break
            f = queue.popleft()
            nxt = self.engine.run(f.remediation_id, f.step)
            if nxt is not None:
                (waiting if nxt.countdown else queue).append(nxt)
        return waiting


@pytest.fixture
def pair(sessions: sessionmaker[Session], clock: FakeClock) -> dict[str, Cluster]:
    return {name: Cluster(name, sessions, clock, make_settings()) for name in CLUSTERS}


def settle(cluster: Cluster, todo: list[FollowUp]) -> None:
    for _ in range(40):
        todo = cluster.drive(todo)
        if not todo:
            return
        cluster.clock.advance(max(f.countdown for f in todo))
    raise AssertionError("workflow did not settle")


def test_the_same_name_in_two_clusters_is_two_nodes_each_remediated_by_its_own(pair, sessions) -> None:
    west, east = pair["west"], pair["east"]
    settle(west, west.fail("gpu-node-0"))
    settle(east, east.fail("gpu-node-0"))
    with sessions() as s:  # unscoped: the on-call view of every cluster
        rows = s.execute(select(Remediation.cluster, Remediation.node, Remediation.status)
                         .order_by(Remediation.cluster)).all()
        assert [tuple(r) for r in rows] == [("east", "gpu-node-0", "succeeded"), ("west", "gpu-node-0", "succeeded")]
        assert sorted(s.execute(select(Node.cluster).where(Node.name == "gpu-node-0")).scalars()) == ["east", "west"]
        assert sorted(s.scalars(select(Event.cluster))) == ["east", "west"]
        assert sorted(s.scalars(select(AuditLog.cluster).where(AuditLog.action == "open"))) == ["east", "west"]
    for cluster in (west, east):  # each world saw its own node drained, restarted and returned, once
        assert len(cluster.world.calls("vm.restart", effect=True)) == 1
        assert cluster.world.node("gpu-node-0")["slurm"]["flags"] == []


def test_a_workflow_never_acts_on_another_clusters_remediation(pair) -> None:
    west, east = pair["west"], pair["east"]
    (first,) = east.fail("gpu-node-3")
    assert west.engine.run(first.remediation_id, first.step) is None  # west's sessions cannot see it
    assert west.world.calls() == [] and not east.world.calls("slurm.drain")
    with east.sessions() as s:
        assert s.get(Remediation, first.remediation_id).step == "slurm_drain"  # type: ignore[union-attr]
    with west.sessions() as s:
        assert s.get(Remediation, first.remediation_id) is None


def test_a_storm_latches_its_own_clusters_breaker_only(pair) -> None:
    west, east = pair["west"], pair["east"]
    storm = [f for i in range(5) for f in west.fail(f"gpu-node-{i}")]  # 5 of 20 = 25% > 10%
    west.drive(storm)
    lone = east.fail("gpu-node-9")
    settle(east, lone)
    assert not west.world.calls("vm.restart")
    assert len(east.world.calls("vm.restart", effect=True)) == 1
    with west.sessions() as s:
        assert breaker_state(s)["open"] is True
        held = s.scalars(select(Remediation.wait_reason).where(Remediation.status == "waiting")).all()
        assert len(held) == 5 and all("storm breaker open" in w for w in held)
    with east.sessions() as s:
        assert breaker_state(s) == {}  # never latched: the barrier is east's remediation that succeeded
        assert s.scalars(select(Remediation.status)).all() == ["succeeded"]


def test_a_pause_holds_its_own_cluster_only(pair) -> None:
    west, east = pair["west"], pair["east"]
    with west.sessions() as s, s.begin():
        control_set(s, PAUSED, {"paused": True, "why": "slurmctld unreachable"}, now=west.clock.now())
    west.drive(west.fail("gpu-node-1"))
    settle(east, east.fail("gpu-node-1"))
    assert not west.world.calls("slurm.drain") and not west.world.calls("vm.restart")
    assert len(east.world.calls("vm.restart", effect=True)) == 1
    with west.sessions() as s:
        (rem,) = s.scalars(select(Remediation)).all()
        assert rem.status == "waiting" and "pause" in (rem.wait_reason or "")


def test_a_domain_repair_is_held_by_its_own_clusters_pause_only(pair, clock) -> None:
    """West's pause holds none of east's domain repairs (``cluster.fleet_latch`` ships off): the repair
    of east's block b1 climbs its ladder (no validation here: drain, jobs, quarantine) all the same."""
    west, east = pair["west"], pair["east"]
    with west.sessions() as s, s.begin():
        control_set(s, PAUSED, {"paused": True, "why": "switch work"}, now=clock.now())
    for i in range(4):
        east.ingest(NodeEvent(source=Source.SLURM, node=f"gpu-node-{i}", kind=EventKind.DOMAINS, state="topology",
                              domains={"block": "b1"}, domain_sizes={"block": 4}, observed_at=clock.now()).to_json())
    sxid = "SXID 12028 NVSwitch fatal"
    show_fault(east.world, "gpu-node-1", "DRAIN", sxid)
    with east.sessions() as s, s.begin():
        opened = ingest(s, [NodeEvent(source=Source.SLURM, node="gpu-node-1", kind=EventKind.UNHEALTHY, state="DRAIN",
                                      reason=sxid, observed_at=clock.now()).to_json()], east.settings.policy, clock=clock)
    (repair,) = opened.repairs
    repairs = DomainRepairs(east.sessions, Adapters(MemorySlurm(east.world), MemoryKube(east.world),
                                                    MemoryVM(east.world)), east.settings, clock=clock)
    for _ in range(20):
        if (wait := repairs.advance(repair)) is None:
            break
        clock.advance(wait)
    with east.sessions() as s:
        rep = s.get(DomainRepair, repair)
        assert rep is not None and rep.status is DomainRepairStatus.QUARANTINED, (rep and rep.wait_reason)
        assert [str(step.step) for step in rep.steps] == ["drain", "jobs", "quarantine"]


def test_an_event_naming_another_cluster_on_a_clusters_stream_is_kept_and_refused(pair, sessions) -> None:
    west = pair["west"]
    assert west.fail("gpu-node-2", stream="east") == []  # west's event read from east's stream
    with sessions() as s:
        (row,) = s.scalars(select(RejectedEvent)).all()
        assert row.cluster == "east" and row.error.startswith("foreign-cluster: an event of cluster west")
        assert s.scalar(select(func.count()).select_from(Remediation)) == 0


def test_the_fleet_latch_is_an_explicit_setting_that_holds_every_cluster(sessions, clock) -> None:
    """With ``cluster.fleet_latch`` on (stated here; it ships off), one cluster's pause and one
    cluster's storm breaker hold the other's machine actions too."""
    settings = make_settings(fleet_latch=True)
    west, east = (Cluster(name, sessions, clock, settings) for name in CLUSTERS)
    with west.sessions() as s, s.begin():
        control_set(s, PAUSED, {"paused": True, "by": "alice", "reason": "switch work"}, now=clock.now())
    east.drive(east.fail("gpu-node-4"))
    assert not east.world.calls("slurm.drain")
    with east.sessions() as s:
        (rem,) = s.scalars(select(Remediation)).all()
        assert rem.status == "waiting" and "cluster west paused (cluster.fleet_latch)" in (rem.wait_reason or "")
    with west.sessions() as s, s.begin():
        control_set(s, PAUSED, {"paused": False}, now=clock.now())
    storm = [f for i in range(5) for f in west.fail(f"gpu-node-{i}")]
    west.drive(storm)
    clock.advance(60)
    east.drive([FollowUp(rem.id, rem.step)])
    with east.sessions() as s:
        rem = s.get(Remediation, rem.id)
        assert rem is not None and "cluster west's storm breaker (cluster.fleet_latch)" in (rem.wait_reason or "")
    assert not east.world.calls("vm.restart") and not west.world.calls("vm.restart")


def test_an_incident_is_one_clusters_domain_failing_never_two_clusters_added_up(sessions, clock) -> None:
    """Both clusters have a clique ``c1`` of gpu-node-[0-3]; half of one clique failing is an incident.
    One failure in each cluster is not (it would be, added up); a second failure in east is."""
    settings = make_settings().model_copy(update={"incidents": make_settings().incidents.model_copy(
        update={"min_nodes": 4, "min_fraction": 0.5, "window_s": 60, "vm_grace_s": 60})})
    west, east = (Cluster(name, sessions, clock, settings) for name in CLUSTERS)
    for cluster in (west, east):
        for i in range(4):
            cluster.ingest(NodeEvent(source=Source.KUBERNETES, node=f"gpu-node-{i}", kind=EventKind.DOMAINS,
                                     state="labels", domains={"nvidia.com/gpu.clique": "c1"},
                                     observed_at=clock.now()).to_json())
    west.fail("gpu-node-0")
    east.fail("gpu-node-1")
    with sessions() as s:
        assert s.scalars(select(Incident)).all() == []  # the barrier: both failures were decided above
    clock.advance(5)
    east.fail("gpu-node-2")
    with sessions() as s:
        (incident,) = s.scalars(select(Incident)).all()
        assert (incident.cluster, incident.name, incident.nodes) == ("east", "c1", ["gpu-node-1", "gpu-node-2"])


def test_an_inventory_records_its_nodes_facts_in_its_own_cluster(pair, sessions) -> None:
    west, east = pair["west"], pair["east"]
    for cluster, partition in ((west, "gpu-west"), (east, "gpu-east")):
        event = NodeEvent(source=Source.SLURM, cluster=cluster.name, node="gpu-node-4", kind=EventKind.INVENTORY,
                          state="IDLE", observed_at=cluster.clock.now(), partitions=[partition], features=["a100"])
        with cluster.sessions() as s, s.begin():
            ingest(s, [Published(event.to_json().encode(), Publisher.SLURM, cluster.name)], cluster.settings.policy,
                   clock=cluster.clock)
    with sessions() as s:
        rows = s.execute(select(Node.cluster, Node.partitions).where(Node.name == "gpu-node-4")
                         .order_by(Node.cluster)).all()
        assert [tuple(r) for r in rows] == [("east", ["gpu-east"]), ("west", ["gpu-west"])]
        assert s.scalar(select(func.count()).select_from(RejectedEvent)) == 0
