"""A domain fault at the real ingest, on real Postgres: one repair per NVLink domain, none per tray;
and the partial-domain drain on the same blocks.

Two blocks of four trays (Slurm's topology/block, as the watcher publishes it). An SXID on two trays of
b1 opens one domain repair and no remediation; a tray's own XID in b2 stays a node fault; a tray fault
while b1's repair runs joins it and opens nothing.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session, sessionmaker
from typer.testing import CliRunner

from remediation.adapters.memory import MemoryKube, MemorySlurm, MemoryVM, MemoryWorld
from remediation.cli.oncall import app
from remediation.clock import FakeClock
from remediation.db.models import AuditLog, DomainRepair, Event, Node, Remediation, RemediationStep
from remediation.db.queries import cluster_view, is_paused
from remediation.domain.events import EventKind, NodeEvent, Source
from remediation.domain.outcomes import Adapters
from remediation.domain.statemachine import NodeStatus
from remediation.domain.states import AuditAction
from remediation.domain_repair.rules import DomainRepairStatus, DomainStep
from remediation.domain_repair.service import DomainRepairs, PartialDomains
from remediation.ports.dispatch import SweeperOnly
from remediation.ports.errors import TransientError
from remediation.profiles.service import governance
from remediation.services.ingest import IngestRules, ingest
from remediation.services.metrics import make_registry
from remediation.services.workflow import Workflow
from remediation.settings import Settings
from remediation.validation.port import ValidationResult
from tests.integration.history import drive, engine_settings, publish, sessions  # noqa: F401
from tests.scripted_validator import ScriptedValidator

BLOCKS = {f"gpu-node-{i}": "b1" if i < 4 else "b2" for i in range(8)}


def _event(node: str, reason: str, at: datetime, state: str = "DRAIN") -> str:
    return NodeEvent(source=Source.SLURM, node=node, kind=EventKind.UNHEALTHY, state=state, reason=reason,
                     observed_at=at).to_json()


def _blocks(sessions: sessionmaker[Session], clock: FakeClock) -> None:
    events = [NodeEvent(source=Source.SLURM, node=n, kind=EventKind.DOMAINS, state="topology",
                        domains={"block": b}, domain_sizes={"block": 4}, observed_at=clock.now()).to_json()
              for n, b in BLOCKS.items()]
    with sessions() as s, s.begin():
        ingest(s, events, Settings().policy, clock=clock)


def _sxid_on_b1(sessions: sessionmaker[Session]) -> tuple[FakeClock, int]:
    """The blocks learnt, then an SXID on gpu-node-2 through the ingest: the clock and the repair it opened."""
    clock = FakeClock(datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=5))
    _blocks(sessions, clock)
    with sessions() as s, s.begin():
        (rid,) = ingest(s, [_event("gpu-node-2", "sxid 20034 on nvswitch 3", clock.now())], Settings().policy,
                        clock=clock, rules=IngestRules(gpu_reset=True)).repairs
    return clock, rid


def test_an_sxid_on_two_trays_opens_one_domain_repair_and_no_remediation(sessions: sessionmaker[Session]) -> None:
    clock = FakeClock(datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=5))
    _blocks(sessions, clock)
    clock.advance(1)
    batch = [_event("gpu-node-1", "SXID 12028 NVSwitch fatal", clock.now()),
             _event("gpu-node-2", "sxid 20034 on nvswitch 3", clock.now()),
             _event("gpu-node-5", "xid 79 GPU has fallen off the bus", clock.now())]
    with sessions() as s, s.begin():
        result = ingest(s, batch, Settings().policy, clock=clock)
    with sessions() as s:
        (rep,) = s.scalars(select(DomainRepair)).all()
        assert (rep.kind, rep.name, rep.trays, rep.size) == ("block", "b1", [f"gpu-node-{i}" for i in range(4)], 4)
        assert (rep.status, rep.step, rep.fault_class) == (DomainRepairStatus.RUNNING, DomainStep.DRAIN, "nvswitch")
        assert rep.reporters == ["gpu-node-1", "gpu-node-2"]
        assert result.repairs == [rep.id]
        # The tray's own XID in b2 is a node fault: its remediation is the only one.
        assert s.scalars(select(Remediation.node)).all() == ["gpu-node-5"]
        decisions = dict(s.execute(select(Event.node, Event.decision).where(Event.kind == EventKind.UNHEALTHY)).all())
        assert decisions == {"gpu-node-1": "domain", "gpu-node-2": "domain", "gpu-node-5": "open"}
        statuses = dict(s.execute(select(Node.name, Node.status)).all())
        assert {statuses[f"gpu-node-{i}"] for i in range(4)} == {NodeStatus.REMEDIATING}
        opened = s.scalar(select(func.count()).select_from(AuditLog).where(
            AuditLog.action == AuditAction.DOMAIN_REPAIR_OPENED))
        assert opened == 1
    running = {"cluster": "default", "status": "running"}
    assert make_registry(sessions).get_sample_value("remediation_domain_repairs_total", running) == 1
    clock.advance(30)
    with sessions() as s, s.begin():
        later = ingest(s, [_event("gpu-node-3", "xid 79 GPU has fallen off the bus", clock.now())],
                       Settings().policy, clock=clock)
    with sessions() as s:
        assert later.opened == [] and later.repairs == []
        assert s.scalar(select(func.count()).select_from(Remediation)) == 1
        (rep,) = s.scalars(select(DomainRepair)).all()
        assert rep.reporters == ["gpu-node-1", "gpu-node-2", "gpu-node-3"]
        reason = s.scalar(select(Event.decision_reason).where(Event.node == "gpu-node-3",
                                                              Event.kind == EventKind.UNHEALTHY))
        assert reason == f"joined domain repair #{rep.id} (block b1): the domain's ladder runs for every tray"


def test_on_call_reads_the_repair_from_the_cli(pg_url: str, sessions: sessionmaker[Session]) -> None:
    clock = FakeClock(datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=5))
    _blocks(sessions, clock)
    with sessions() as s, s.begin():
        ingest(s, [_event("gpu-node-2", "sxid 20034 on nvswitch 3", clock.now())], Settings().policy, clock=clock)
    env = {"REMEDIATION_DATABASE__URL": pg_url, "USER": "oncall-tester", "COLUMNS": "250", "REMEDIATION_CONFIG": ""}
    listed = CliRunner().invoke(app, ["domains", "list"], env=env, obj=lambda settings: SweeperOnly())
    assert listed.exit_code == 0, listed.output
    assert "1 running block b1 nvswitch drain 4: gpu-node-[0-3]" in " ".join(listed.stdout.split())
    shown = CliRunner().invoke(app, ["domains", "show", "1", "-o", "json"], env=env, obj=lambda settings: SweeperOnly())
    assert shown.exit_code == 0, shown.output
    d = json.loads(shown.stdout)
    assert (d["reporters"], d["status"], d["steps"]) == (["gpu-node-2"], "running", [])
    node = CliRunner().invoke(app, ["nodes", "show", "gpu-node-0"], env=env, obj=lambda settings: SweeperOnly())
    assert node.exit_code == 0, node.output
    assert ("Domain repair: #1 (block b1, nvswitch) at drain: see `remediation domains show 1`"
            in " ".join(node.stdout.split()))


def test_an_sxid_on_a_tray_in_no_domain_is_its_own_fault(sessions: sessionmaker[Session]) -> None:
    clock = FakeClock(datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=5))
    with sessions() as s, s.begin():
        ingest(s, [_event("gpu-node-9", "SXID 12028 NVSwitch fatal", clock.now())], Settings().policy, clock=clock)
    with sessions() as s:
        assert s.scalars(select(DomainRepair)).all() == []
        assert s.scalars(select(Remediation.fault_class)).all() == ["nvswitch"]


def test_nvlink_faults_on_two_trays_of_a_block_are_the_domains(sessions: sessionmaker[Session]) -> None:
    """The first tray's NVLink fault is its own (a remediation); the second within the window makes
    them the domain's: one repair, and the first tray's remediation is held by it."""
    clock = FakeClock(datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=5))
    _blocks(sessions, clock)
    clock.advance(1)
    with sessions() as s, s.begin():
        first = ingest(s, [_event("gpu-node-4", "xid 74 NVLink error", clock.now())], Settings().policy, clock=clock)
    clock.advance(60)
    with sessions() as s, s.begin():
        second = ingest(s, [_event("gpu-node-6", "xid 74 NVLink error", clock.now())], Settings().policy, clock=clock)
    with sessions() as s:
        assert len(first.opened) == 1 and second.opened == []
        (rep,) = s.scalars(select(DomainRepair)).all()
        assert (rep.name, rep.fault_class, rep.reporters) == ("b2", "nvlink", ["gpu-node-6"])
        assert "NVLink faults on 2 trays of block b2 (gpu-node-[4,6]) within 600 s" in (rep.fault_evidence or "")


def test_a_partial_block_has_its_rest_drained_only_where_its_profile_asks(sessions: sessionmaker[Session]) -> None:
    """``incidents.drain_partial_domains`` (off as shipped: this test turns it on) drains b1's healthy rest
    once one tray of four fails, leaves a human's drain alone, and gives back only its own drains once
    the block is whole again. Shipped, nothing is drained."""
    clock = FakeClock(datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=5))
    _blocks(sessions, clock)
    world = MemoryWorld([f"gpu-node-{i}" for i in range(8)])
    world.set_slurm("gpu-node-3", flags=["DRAIN"], reason="ops: cable check")
    adapters = Adapters(slurm=MemorySlurm(world), kube=None, machine=None)
    with sessions() as s, s.begin():
        s.execute(update(Node).where(Node.name == "gpu-node-1").values(status=NodeStatus.UNHEALTHY))

    def sweep(drain: bool) -> dict[str, list[str]]:
        cfg = Settings(incidents={"drain_partial_domains": drain})
        repairs = DomainRepairs(sessions, adapters, cfg, clock=clock)
        return PartialDomains(repairs, governance(cfg)).sweep()

    assert sweep(False) == {}
    assert sweep(True) == {"drained b1": ["gpu-node-0", "gpu-node-2"]}
    assert world.node("gpu-node-0")["slurm"]["reason"].startswith("remediation: partial domain: block b1 has 3 healthy")
    assert sweep(True) == {}  # drained already: nothing twice
    with sessions() as s, s.begin():
        s.execute(update(Node).where(Node.name == "gpu-node-1").values(status=NodeStatus.HEALTHY))
    assert sweep(True) == {"gave back b1": ["gpu-node-0", "gpu-node-2"]}
    assert "DRAIN" not in world.node("gpu-node-0")["slurm"]["flags"] and world.node("gpu-node-3")["slurm"]["reason"] == "ops: cable check"
    with sessions() as s:
        rows = s.scalars(select(AuditLog.reason).where(AuditLog.action == AuditAction.PARTIAL_DOMAIN)).all()
        assert rows == ["drained b1: gpu-node-[0,2]", "gave back b1: gpu-node-[0,2]"]


def test_a_human_cancels_a_repair_and_the_sweep_takes_its_jobs_down(pg_url: str,
                                                                    sessions: sessionmaker[Session]) -> None:
    """`remediation domains cancel` stops the repair where it stands (its trays left drained, marked
    unhealthy); the sweep then finishes the fabric-restart job it had started, once."""
    clock, rid = _sxid_on_b1(sessions)
    world = MemoryWorld([f"gpu-node-{i}" for i in range(8)])
    world.set_slurm("gpu-node-2", flags=["DRAIN"], reason="sxid 20034 on nvswitch 3")
    validator = ScriptedValidator([ValidationResult(done=False)] * 20)
    # The shipped policy but for the breaker: a block of 4 is half this 8-node pool, a storm at 10%.
    cfg = Settings(policy={"breaker_max_fraction": 0.6})
    repairs = DomainRepairs(sessions, Adapters(slurm=MemorySlurm(world), kube=None, machine=None, validator=validator),
                            cfg, clock=clock)
    for _ in range(3):  # drain, jobs, then the first fabric-restart job
        assert repairs.advance(rid) is not None
    env = {"REMEDIATION_DATABASE__URL": pg_url, "USER": "oncall-tester", "COLUMNS": "250", "REMEDIATION_CONFIG": ""}
    said = CliRunner().invoke(app, ["domains", "cancel", str(rid), "-r", "rack swap scheduled"], env=env,
                              obj=lambda settings: SweeperOnly())
    assert said.exit_code == 0, said.output
    assert said.stdout.startswith(f"domain repair #{rid} cancelled; its trays are left as they are for a human")
    assert repairs.advance(rid) is None  # a cancelled repair takes no further step
    assert len(repairs.take_down()) == 1 and repairs.take_down() == []  # once
    assert [c[0] for c in validator.calls] == ["start", "finish"]
    with sessions() as s:
        rep = s.get(DomainRepair, rid)
        assert rep is not None and rep.status is DomainRepairStatus.CANCELLED
        assert rep.close_reason == "cancelled by oncall-tester: rack swap scheduled"
        (row,) = [r for r in rep.steps if r.step is DomainStep.FABRIC_RESTART]
        assert (row.status.value, row.outcome) == ("failed", "cancelled; set-up undone")
        assert {n.status for n in s.scalars(select(Node).where(Node.name.in_(rep.trays)))} == {NodeStatus.UNHEALTHY}
        assert all("DRAIN" in world.node(t)["slurm"]["flags"] for t in rep.trays)  # left as they are


def test_a_trays_own_remediation_ends_with_the_domain_check_when_its_policy_asks(
        sessions: sessionmaker[Session]) -> None:
    """``validation.domain_check_on_return`` (off as shipped; on here): gpu-node-1's own remediation (Xid
    79) passes its own GPU check, then its return hands the tray to a repair of b1 that proves the domain
    first; the domain check passes and every tray b1 has returns."""
    clock = FakeClock(datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=5))
    _blocks(sessions, clock)
    settings = engine_settings(validation={"backend": "slurm", "domain_check_on_return": True})
    world = MemoryWorld([f"gpu-node-{i}" for i in range(8)])
    passed = ValidationResult(done=True, exit_code=0, output="PASS", state="COMPLETED")
    checks = ScriptedValidator([passed, passed])
    engine = Workflow(sessions, Adapters(MemorySlurm(world), MemoryKube(world), MemoryVM(world), checks), settings,
                      clock=clock)
    drive(engine, clock, publish(sessions, settings, clock, "gpu-node-1", reason="xid 79", world=world))
    with sessions() as s:
        rem = s.scalars(select(Remediation)).one()
        assert rem.status.value == "succeeded" and rem.ctx.domain_repair is not None, [
            (r.step, r.outcome, r.error) for r in s.scalars(select(RemediationStep))]
        returned = s.scalars(select(RemediationStep.outcome).where(RemediationStep.step == "return")).one()
        assert returned.startswith(f"handed to domain repair #{rem.ctx.domain_repair}: the tray stays drained")
    assert "DRAIN" in world.node("gpu-node-1")["slurm"]["flags"]  # not back yet: the domain decides
    repairs = DomainRepairs(sessions, Adapters(MemorySlurm(world), MemoryKube(world), None, checks), settings,
                            clock=clock)
    assert repairs.due() == [rem.ctx.domain_repair]  # the sweep sends it
    for _ in range(20):
        if repairs.advance(rem.ctx.domain_repair) is None:
            break
    with sessions() as s:
        rep = s.get(DomainRepair, rem.ctx.domain_repair)
        assert rep is not None and rep.status is DomainRepairStatus.RETURNED
        assert [r.step for r in rep.steps] == [DomainStep.DRAIN, DomainStep.JOBS, DomainStep.DOMAIN_CHECK,
                                                DomainStep.RETURN]
        assert rep.rungs[:2] == [DomainStep.DOMAIN_CHECK, DomainStep.FABRIC_RESTART]  # a failure climbs
    (check,) = [c for name, c in checks.calls if name == "start" and c.nodes]
    assert check.nodes == ("gpu-node-0", "gpu-node-1", "gpu-node-2", "gpu-node-3")
    assert not any("DRAIN" in world.node(f"gpu-node-{i}")["slurm"]["flags"] for i in range(4))


def test_a_tray_slurm_no_longer_knows_is_left_out_and_the_rest_is_repaired(sessions: sessionmaker[Session]) -> None:
    """b1's last topology still names gpu-node-3, which Slurm no longer has: the drain says so and
    drains the rest; the repair goes on over what Slurm has, and returns only the trays it drained."""
    clock, rid = _sxid_on_b1(sessions)
    world = MemoryWorld(["gpu-node-0", "gpu-node-1", "gpu-node-2", *(f"gpu-node-{i}" for i in range(4, 8))])
    world.set_slurm("gpu-node-2", flags=["DRAIN"], reason="sxid 20034 on nvswitch 3")
    passed = ValidationResult(done=True, exit_code=0, output="PASS", state="COMPLETED")
    repairs = DomainRepairs(sessions, Adapters(slurm=MemorySlurm(world), kube=None, machine=None,
                                               validator=ScriptedValidator([passed] * 5)),
                            Settings(policy={"breaker_max_fraction": 0.6}), clock=clock)  # 4 of 8: see above
    for _ in range(20):
        if repairs.advance(rid) is None:
            break
    with sessions() as s:
        rep = s.get(DomainRepair, rid)
        assert rep is not None and rep.status is DomainRepairStatus.RETURNED
        assert rep.ours == ["gpu-node-0", "gpu-node-1", "gpu-node-2"]
        assert rep.steps[0].outcome == "drained gpu-node-[0-2]; gpu-node-3 unknown to Slurm"


def test_a_repair_counts_as_all_its_trays_for_the_breaker_and_max_concurrent(sessions: sessionmaker[Session]) -> None:
    """From the moment it opens its 4 trays are 4 failures in the breaker's window; while a rung acts
    they are 4 machine actions in flight (what every node's admission and every other repair's reads)."""
    clock, rid = _sxid_on_b1(sessions)
    window = Settings().policy.breaker_window
    with sessions() as s:
        view = cluster_view(s, clock.now(), window, exclude=None)
        assert (view.failed_in_window, view.machine_active) == (4, 0)
    with sessions() as s, s.begin():
        s.execute(update(DomainRepair).where(DomainRepair.id == rid).values(step=DomainStep.FABRIC_RESTART))
    with sessions() as s:
        assert cluster_view(s, clock.now(), window, exclude=None).machine_active == 4


class _Unanswering(MemorySlurm):
    """slurmctld that does not answer: every read times out."""

    def get_node(self, name: str) -> Any:
        raise TransientError("slurmctld did not answer within 10 s")


def test_errors_in_a_row_from_slurm_pause_automation_and_act_on_no_tray(sessions: sessionmaker[Session]) -> None:
    """A dependency that stays down is our plumbing's fault, not the domain's: after
    ``workflow.transient_retries`` errors in a row (2 here, and no time budget) automation pauses, with
    nothing drained and the repair still at its first step."""
    clock, rid = _sxid_on_b1(sessions)
    world = MemoryWorld([f"gpu-node-{i}" for i in range(8)])
    cfg = Settings(workflow={"transient_retries": 2, "transient_budget_s": 0})
    repairs = DomainRepairs(sessions, Adapters(slurm=_Unanswering(world), kube=None, machine=None), cfg, clock=clock)
    for look in range(3):
        with sessions() as s:
            assert not is_paused(s), f"paused after {look} errors"
        assert repairs.advance(rid) is not None
    with sessions() as s:
        assert is_paused(s)
        rep = s.get(DomainRepair, rid)
        assert rep is not None and (rep.status, rep.step) == (DomainRepairStatus.RUNNING, DomainStep.DRAIN)
        assert rep.steps[0].detail["errors"]["count"] == 3
    assert world.calls() == []  # nothing acted on any tray


def test_a_tray_a_human_holds_is_left_out_of_every_job(sessions: sessionmaker[Session]) -> None:
    """gpu-node-3 was drained for maintenance before the SXID: the repair neither drains it again nor
    runs a job on it (fabric restarts on the other 3, the domain check over those 3), and leaves it drained."""
    clock, rid = _sxid_on_b1(sessions)
    world = MemoryWorld([f"gpu-node-{i}" for i in range(8)])
    world.set_slurm("gpu-node-2", flags=["DRAIN"], reason="sxid 20034 on nvswitch 3")
    world.set_slurm("gpu-node-3", flags=["DRAIN"], reason="ops: cable check")
    passed = ValidationResult(done=True, exit_code=0, output="PASS", state="COMPLETED")
    checks = ScriptedValidator([passed] * 5)
    repairs = DomainRepairs(sessions, Adapters(slurm=MemorySlurm(world), kube=None, machine=None, validator=checks),
                            Settings(policy={"breaker_max_fraction": 0.6}), clock=clock)  # 4 of 8: see above
    for _ in range(20):
        if repairs.advance(rid) is None:
            break
    started = [c for name, c in checks.calls if name == "start"]
    assert [c.node for c in started if not c.nodes] == ["gpu-node-0", "gpu-node-1", "gpu-node-2"]
    assert [c.nodes for c in started if c.nodes] == [("gpu-node-0", "gpu-node-1", "gpu-node-2")]
    assert world.node("gpu-node-3")["slurm"]["reason"] == "ops: cable check"
    with sessions() as s:
        rep = s.get(DomainRepair, rid)
        assert rep is not None and rep.status is DomainRepairStatus.RETURNED
        assert rep.steps[0].outcome == "drained gpu-node-[0-2]; left gpu-node-3 as someone else drained them"
