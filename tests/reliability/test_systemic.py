"""Scenario 13: a fault in our own plumbing pauses automation; it is never a verdict on a node.

Two faults of the service's own, each in the middle of a storm of real node failures:

- **The cloud starts answering 401** (an expired service-account token): GCE and Azure behind the
  real SDKs, real worker processes, Postgres and Redis (:class:`CloudRig`). Three nodes are remediated
  while the credential is good; then every cloud call is answered 401 and five more nodes fail.
- **scontrol cannot reach slurmctld** (munge down, controller unreachable): the real scontrol against a
  real Slurm 22.05 controller, with the engine run in-process (:class:`Pipeline`). The controller comes
  back, and the health probe lifts the pause by itself.

Each must end with 0 nodes quarantined, automation paused with the reason, exactly 1 page (counted
at a local webhook fed by the real notification pass) and no failure charged to any node; then, once
the fault is gone, every remediation finishes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session, sessionmaker

from remediation.adapters.memory import MemoryKube
from remediation.adapters.slurm.cli import CliSlurm
from remediation.clock import SystemClock
from remediation.db.models import AuditLog, Remediation
from remediation.db.queries import PAUSED, control_get
from remediation.domain.step_bodies import Adapters
from remediation.ports.dispatch import FollowUp
from remediation.services import lever_rules
from remediation.services.notify import run_pass
from remediation.services.workflow import Workflow
from remediation.settings import NotifySettings
from tests.integration.cloud.test_cloud_workflow import CloudRig, make_rig
from tests.integration.slurm.conftest import SlurmCluster, slurm, slurm_cluster  # noqa: F401  (fixtures)
from tests.integration.slurm.test_slurm_workflow import Pipeline, pipeline  # noqa: F401  (fixture)
from tests.integration.workerproc import wait_for
from tests.reliability.conftest import Recorder
from tests.reliability.test_storm import Receiver, receiver  # noqa: F401  (fixture)

EXPIRED = 401  # what the clouds answer once the token has expired


def audit_rows(db: Engine, action: str) -> list[AuditLog]:
    with Session(db) as s:
        return list(s.scalars(select(AuditLog).where(AuditLog.action == action).order_by(AuditLog.id)))


def paused(db: Engine) -> dict[str, Any]:
    with Session(db) as s:
        return control_get(s, PAUSED)


@pytest.fixture
def rig(
    pg_url: str, redis_client: redis.Redis, redis_prefix: str, tmp_path: Path, db: Engine, receiver: Receiver
) -> Iterator[CloudRig]:
    yield from make_rig(8, pg_url, redis_client, redis_prefix, tmp_path, db,
                        REMEDIATION_NOTIFY__WEBHOOK_URL=receiver.url)


@pytest.mark.scenario("13 systemic fault: cloud 401 mid-storm")
def test_cloud_answering_401_mid_storm_pauses_quarantines_nothing_and_pages_once(
    rig: CloudRig, db: Engine, receiver: Receiver, scenario_figures: Recorder
) -> None:
    nodes = rig.cluster.names
    before, storm = nodes[:3], nodes[3:]
    worker = rig.worker()
    for node in before:
        rig.fail(node)
    rig.wait_status(before, "succeeded", 120, worker)

    for fake in (rig.cluster.gce, rig.cluster.azure):
        fake.faults.fail_randomly(1.0, ((EXPIRED, None),))  # the token expired: every cloud call is refused
    started = time.monotonic()
    for node in storm:
        rig.fail(node)
    # Barrier: every storm remediation has been claimed and refused by admission while paused (each had its
    # chance to act), and the one that met the 401 recorded it on its step.
    wait_for(lambda: paused(db).get("paused") is True, 120, "automation to pause", worker)
    def parked() -> bool:
        return all((r := rig.rem(n)) is not None and r.status == "waiting" and "paused" in (r.wait_reason or "")
                   for n in storm)

    try:
        wait_for(parked, 60, "every storm remediation to wait on the pause", worker)
    except AssertionError:
        where = {n: (r.step, r.status, r.wait_reason) if (r := rig.rem(n)) else None for n in storm}
        raise AssertionError(f"not every storm remediation is parked on the pause: {where}") from None
    paused_after = time.monotonic() - started
    refused = sum(1 for n in storm for r in rig.steps(n) if r.error_kind == "CredentialError")
    state = paused(db)
    quarantined = [n for n in nodes if rig.status(n) == "quarantined"]
    run_pass(sessionmaker(db), NotifySettings(webhook_url=receiver.url))
    pages = receiver.count("Automation PAUSED")

    # Recovery: a human rotates the credential and resumes; every held remediation finishes.
    for fake in (rig.cluster.gce, rig.cluster.azure):
        fake.faults.fail_randomly(0)
    with Session(db) as s, s.begin():
        lever_rules.set_paused(s, False, "alice", reason="rotated the service account key",
                               now=SystemClock().now())
    resumed = time.monotonic()
    rig.wait_status(storm, "succeeded", 120, worker)
    recovery = time.monotonic() - resumed
    with Session(db) as s:
        charged = {n: len(s.scalars(select(Remediation.id).where(Remediation.node == n)).all()) for n in nodes}

    lost = scenario_figures.record(
        db=db,
        duplicate_actions=sum(max(0, rig.cluster.vm_actions(n) - 1) for n in nodes), recovery_s=round(recovery, 2),
        notes=f"paused {paused_after:.1f}s after the storm began; {refused} step(s) met the {EXPIRED}; "
              f"{len(quarantined)} quarantined; {pages} page(s); recovery = human resume to all succeeded",
    )
    assert not lost, f"{lost} published events are not in Postgres"
    assert state["by"] == "system" and "CredentialError" in state["reason"] and "401" in state["reason"]
    assert state["self_healing"] is False
    assert refused >= 1 and quarantined == []
    assert pages == 1, receiver.posts
    assert len(audit_rows(db, "pause")) == 1
    assert charged == {n: 1 for n in nodes}  # one remediation each: the 401 opened or closed nothing
    assert all(rig.cluster.vm_actions(n) == 1 for n in nodes)


@pytest.mark.scenario("13 systemic fault: slurmctld unreachable")
def test_unreachable_scontrol_pauses_and_the_probe_resumes_when_slurmctld_answers(
    slurm: SlurmCluster,  # noqa: F811
    pipeline: Callable[..., Pipeline],  # noqa: F811
    tmp_path: Path,
    receiver: Receiver,  # noqa: F811
    scenario_figures: Recorder,
) -> None:
    p = pipeline(probe_successes=3)
    nodes = ["gpu-node-1", "gpu-node-2", "gpu-node-3"]
    # The same cluster seen through a slurm.conf whose controller port nobody listens on: what scontrol
    # meets when slurmctld is down or unreachable.
    conf = tmp_path / "slurm.conf"
    lines = Path(p.settings.slurm.slurm_conf or slurm.conf).read_text().splitlines()
    conf.write_text("\n".join("SlurmctldPort=1" if x.startswith("SlurmctldPort=") else x for x in lines) + "\n")
    down = Adapters(CliSlurm(p.settings.slurm.model_copy(update={"slurm_conf": str(conf), "command_timeout_s": 20})),
                    MemoryKube(p.world), p.vm)
    engine = Workflow(p.sessions, down, p.settings, clock=p.clock)
    with p.watching():
        for node in nodes:
            slurm.scontrol("update", f"nodename={node}", "state=fail", "reason=xid 79")
        p.wait_until(lambda: len(p.opened) == len(nodes), 10, "three remediations opened")
        todo = p.take_opened()
        waiting: list[FollowUp] = []
        for f in todo:  # each one's first step meets the unreachable controller, or the pause it caused
            nxt = engine.run(f.remediation_id, f.step)
            assert nxt is not None
            waiting.append(nxt)
        state = control_get_pg(p)
        rows = [(r.status, r.wait_reason) for r in rems(p, nodes)]
        probes_down = 0
        for _ in range(2):
            engine.probe()
            probes_down += 1
        still = control_get_pg(p)
        # slurmctld answers again (scontrol with the real configuration): three probes lift the pause.
        engine.adapters = p.adapters
        recovered = time.monotonic()
        answers = 0
        for _ in range(3):
            engine.probe()
            answers += 1
        lifted = control_get_pg(p)
        p.settle(waiting)
    recovery = time.monotonic() - recovered
    with p.sessions() as s:
        pages_rows = len(s.scalars(select(AuditLog).where(AuditLog.action == "pause")).all())
    run_pass(p.sessions, NotifySettings(webhook_url=receiver.url))
    final = [r.status for r in rems(p, nodes)]
    lost = scenario_figures.record(
        db=p.sessions, recovery_s=round(recovery, 2),
        notes=f"{final.count('quarantined')} quarantined; {receiver.count('Automation PAUSED')} page(s); "
              f"{probes_down} failed probes, paused after them: {still['paused']}; "
              f"after {answers} answers, paused: {lifted['paused']}",
    )
    assert not lost, f"{lost} published events are not in Postgres"
    assert state["paused"] and state["by"] == "system" and state["self_healing"] and state["component"] == "slurm"
    assert "Unable to contact slurm controller" in state["reason"]
    assert all(status == "waiting" and "paused" in (why or "") for status, why in rows), rows
    assert still["paused"] is True and still["probe_ok"] == 0
    assert lifted["paused"] is False and "answered 3 times" in lifted["reason"]
    assert final == ["succeeded"] * len(nodes)
    assert pages_rows == 1 and receiver.count("Automation PAUSED") == 1, receiver.posts


def control_get_pg(p: Pipeline) -> dict[str, Any]:
    with p.sessions() as s:
        return control_get(s, PAUSED)


def rems(p: Pipeline, nodes: list[str]) -> list[Remediation]:
    with p.sessions() as s:
        return [s.scalars(select(Remediation).where(Remediation.node == n).order_by(Remediation.id.desc())).first()
                for n in nodes]

