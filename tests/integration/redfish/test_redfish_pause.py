"""A pause stops the clock: BMC credentials wrong for longer than the machine step's timeout, against a
real Redfish BMC (sushy-tools' emulator, HTTPS and basic auth) and a real Postgres.

Three nodes lose a GPU (``xid 79``: the shipped ladder power-cycles the machine, then quarantines). Two
have their ForceOff sent when the BMC's password is rotated, the third meets the 401 at its first read:
automation pauses. The credentials stay wrong longer than ``workflow.vm_operation_timeout_s`` on the
engine's clock; then they are fixed and on-call resumes. Every step resumed after the pause polls what it
recorded or starts afresh and never escalates on time it did not have: all three succeed, none is
quarantined, and every system is On, as the BMC itself answers. While paused, each held remediation
logs "gated" once, not at every look.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import requests
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from remediation.adapters.memory import MemoryKube, MemorySlurm, MemoryWorld
from remediation.db.models import Remediation, RemediationStep
from remediation.domain.events import EventKind, NodeEvent, Source
from remediation.domain.outcomes import Adapters
from remediation.services.ingest import ingest
from remediation.services.lever_rules import set_paused
from remediation.services.workflow import Workflow
from remediation.settings import Settings
from tests.faults import GPU_OFF_THE_BUS
from tests.integration.redfish.conftest import PASSWORD, USER, Emulator
from tests.integration.redfish.test_redfish_bmc import configure, provider_for
from tests.pace import within

NODES = ("node-held-1", "node-held-2", "node-held-3")
# The smallest workflow.vm_operation_timeout_s allows: above the emulator's slowest ForceOff then On (two
# power changes of up to 11 s each). The credentials stay wrong longer, on the engine's clock, which the
# test moves on rather than wait (the incident's 80 s).
TIMEOUT_S = 60
WRONG_FOR_S = 80
FAILED = {"kind": EventKind.UNHEALTHY, "state": "FAIL", "reason": GPU_OFF_THE_BUS}  # a GPU off the bus


class ShiftedClock:
    """Wall time plus a shift the test moves on: a long pause without waiting through it."""

    def __init__(self) -> None:
        self.shift = 0.0

    def now(self) -> datetime:
        return datetime.now(UTC) + timedelta(seconds=self.shift)


def credentials(tmp: Path, password: str) -> None:
    (tmp / "credentials.json").write_text(json.dumps({"rack-1": {"username": USER, "password": password}}))


def power(emulator: Emulator, node: str) -> str:
    """The system's power state, as the BMC answers it."""
    system = emulator.systems[node.removeprefix("node-")]
    answer = requests.get(
        f"{emulator.url}/redfish/v1/Systems/{system}",
        auth=(USER, PASSWORD),
        verify=str(emulator.ca_file),
        timeout=10,
    )
    answer.raise_for_status()
    return str(answer.json()["PowerState"])


def booted(world: MemoryWorld, node: str, clock: ShiftedClock) -> None:
    """What the machine's OS does once it is powered on again (the emulator has none): a new bootID,
    and slurmd registering."""
    world.set_k8s(node, boot_id=uuid.uuid4().hex)
    with world.mutate() as st:
        st["nodes"][node]["slurm"]["slurmd_start"] = clock.now().timestamp()


@dataclass
class Site:
    world: MemoryWorld
    clock: ShiftedClock
    engine: Workflow
    rids: dict[str, int]


def at_the_machine_step(
    emulator: Emulator, sessions: sessionmaker[Session], tmp: Path, nodes: tuple[str, ...]
) -> Site:
    """Remediations of ``nodes`` (a GPU off the bus), run by an engine on a shifted clock with the
    redfish backend, up to their machine step (drain, cordon and evict in a memory world)."""
    world = MemoryWorld(nodes=list(nodes))
    settings = Settings(
        policy={"min_restart_gap_s": 0, "breaker_min_failures": 1000},
        workflow={"poll_interval_s": 1, "lease_s": 30, "vm_operation_timeout_s": TIMEOUT_S},
    )
    provider = provider_for(configure(tmp, emulator), sessions)
    clock = ShiftedClock()
    engine = Workflow(sessions, Adapters(MemorySlurm(world), MemoryKube(world), provider), settings,
                      clock=clock)
    rids: dict[str, int] = {}
    for node in nodes:  # a researcher marks each node failed: Slurm shows what the event reports
        world.set_slurm(node, flags=["FAIL"], reason=GPU_OFF_THE_BUS, user="researcher")
    with sessions() as s, s.begin():
        for node in nodes:
            event = NodeEvent(source=Source.SLURM, node=node, observed_at=clock.now(), **FAILED)
            ((rids[node], _),) = ingest(s, [event.to_json()], settings.policy, clock=clock).opened
    for node in nodes:
        step = "slurm_drain"
        while step != "vm_restart":
            followup = engine.run(rids[node], step)
            assert followup is not None
            step = followup.step
    return Site(world, clock, engine, rids)


def run_to_the_end(site: Site, nodes: tuple[str, ...]) -> dict[str, Remediation]:
    """Run every remediation's steps until it closes; the closed rows by node."""
    deadline = within(60)
    steps = dict.fromkeys(nodes, "vm_restart")
    while steps:
        assert time.monotonic() < deadline, f"not finished: {steps}"
        for node, step in list(steps.items()):
            if step == "verify":
                booted(site.world, node, site.clock)
            followup = site.engine.run(site.rids[node], step)
            if followup is None:
                del steps[node]
            else:
                steps[node] = followup.step
        time.sleep(0.2)
    with site.engine.sessions() as s:
        rows = s.scalars(select(Remediation).where(Remediation.id.in_([site.rids[n] for n in nodes])))
        return {r.node: r for r in rows}


def test_credentials_wrong_longer_than_the_timeout_cost_no_node_anything(
    emulator: Emulator, sessions: sessionmaker[Session], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="remediation.workflow")
    site = at_the_machine_step(emulator, sessions, tmp_path, NODES)
    engine, rids, clock = site.engine, site.rids, site.clock

    for node in NODES[:2]:  # their ForceOff is sent before the password is rotated
        followup = engine.run(rids[node], "vm_restart")
        assert followup is not None and followup.step == "vm_restart"
    credentials(tmp_path, "rotated-" + PASSWORD)
    held = engine.run(rids[NODES[2]], "vm_restart")  # its first read of the BMC: 401, automation pauses
    assert held is not None and held.step == "vm_restart"
    for _ in range(3):  # while paused, every look is refused; the log says so once per remediation
        for node in NODES:
            assert engine.run(rids[node], "vm_restart").step == "vm_restart"  # type: ignore[union-attr]
    gated = [r for r in caplog.records if getattr(r, "outcome", None) == "gated"]
    assert sorted(r.node for r in gated) == sorted(NODES), [r.getMessage() for r in gated]  # type: ignore[attr-defined]

    clock.shift += WRONG_FOR_S  # the credentials stay wrong that long: longer than the step's timeout
    credentials(tmp_path, PASSWORD)  # fixed; on-call resumes
    with sessions() as s, s.begin():
        set_paused(s, False, "oncall", reason="BMC credentials fixed", now=clock.now())

    final = run_to_the_end(site, NODES)
    with sessions() as s:
        machine = {
            row.remediation_id: row
            for row in s.scalars(
                select(RemediationStep).where(
                    RemediationStep.remediation_id.in_(rids.values()), RemediationStep.step == "vm_restart"
                )
            )
        }
    assert {n: (r.status, r.ladder) for n, r in final.items()} == {n: ("succeeded", 0) for n in NODES}, {
        n: r.ctx.quarantine_reason for n, r in final.items()
    }
    for node in NODES:
        op = machine[rids[node]].provider_op["data"]
        assert (op["reset"], op["phase"]) == ("ForceOff", "then-sent"), op  # On followed the ForceOff
        assert emulator.resets(node.removeprefix("node-")) == 2  # ForceOff, then On: the last reset sent
        assert power(emulator, node) == "On"


def test_a_power_cycle_past_its_timeout_never_leaves_the_machine_off(
    emulator: Emulator, sessions: sessionmaker[Session], tmp_path: Path
) -> None:
    node = "node-overdue"
    site = at_the_machine_step(emulator, sessions, tmp_path, (node,))
    followup = site.engine.run(site.rids[node], "vm_restart")  # ForceOff sent; its On waits for Off
    assert followup is not None and followup.step == "vm_restart"
    site.clock.shift += TIMEOUT_S + 1  # the operation's own time runs out before the system is seen Off
    final = run_to_the_end(site, (node,))
    assert final[node].status == "quarantined"  # the rung failed on time: the ladder ends as it should
    # but not before the On that follows the ForceOff was sent: the BMC received both.
    deadline = within(5)
    while emulator.resets("overdue") < 2:
        assert time.monotonic() < deadline, "ForceOff sent, and never an On: the machine is left Off"
        time.sleep(0.1)
    assert emulator.resets("overdue") == 2
