"""Collected evidence in the workflow engine, on real Postgres with the in-memory world and jobs run as
local processes (tests/local_validator.py) against stand-in GPU tools: where the step falls on each
path, and when it does not run.

The GPU check's command is ``/bin/true`` here (the shipped checks call DCGM, which this machine lacks);
the evidence settings are the shipped ones unless a test says otherwise beside it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from remediation.adapters.memory import MemoryKube, MemorySlurm, MemoryVM, MemoryWorld
from remediation.clock import FakeClock
from remediation.db.models import EvidenceItem, Remediation
from remediation.domain.step_bodies import Adapters
from remediation.services.workflow import NO_JOBS, Workflow
from remediation.settings import Settings
from tests.faults import GPU_OFF_THE_BUS
from tests.integration.test_workflow_engine import (  # noqa: F401  (fixtures)
    clock,
    drive,
    publish,
    rem_for,
    steps_of,
    world,
)
from tests.local_validator import LocalJobs

SMI = "#!/bin/sh\necho \"nvidia-smi $*\" >> \"$(dirname \"$0\")/calls\"\necho 'GPU 00000000:3B:00.0'\n"
JOURNALCTL = "#!/bin/sh\necho 'kernel: NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.'\n"
LOGGER = "#!/bin/sh\nshift 3\necho \"$*\" >> \"$(dirname \"$0\")/journal\"\n"
NODE = "gpu-node-5"


@pytest.fixture
def tools(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name, text in (("nvidia-smi", SMI), ("journalctl", JOURNALCTL), ("logger", LOGGER)):
        (tmp_path / name).write_text(text)
        (tmp_path / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    return tmp_path


def settings_with(**over: object) -> Settings:
    return Settings(
        policy={"min_restart_gap_s": 0, "breaker_min_failures": 3, **over.pop("policy", {})},  # type: ignore[dict-item]
        workflow={"poll_interval_s": 5, "drain_timeout_s": 600, "verify_timeout_s": 120, "lease_s": 30},
        validation=over.pop("validation", None) or {
            "backend": "slurm", "checks": {"unknown": ["/bin/true"], "gpu-hardware": ["/bin/true"]}},
        **over,
    )


def engine_for(sessions: sessionmaker[Session], world: MemoryWorld, settings: Settings, clock: FakeClock,
               jobs: LocalJobs | None) -> Workflow:
    return Workflow(sessions, Adapters(MemorySlurm(world), MemoryKube(world), MemoryVM(world), jobs), settings,
                    clock=clock)


def items_of(sessions: sessionmaker[Session], rid: int) -> list[tuple[int, str, str]]:
    with sessions() as s:
        return [(i.step_id, i.name, i.status) for i in s.scalars(
            select(EvidenceItem).where(EvidenceItem.remediation_id == rid).order_by(EvidenceItem.id))]


def test_an_xid79_node_has_its_state_kept_before_its_machine_action(sessions, world, clock, tools) -> None:
    settings, jobs = settings_with(), LocalJobs()
    engine = engine_for(sessions, world, settings, clock, jobs)
    drive(engine, clock, publish(sessions, settings, clock, NODE, reason=GPU_OFF_THE_BUS, world=world))
    rem = rem_for(sessions, NODE)
    rows = steps_of(sessions, rem.id)
    assert rem.status == "succeeded" and [r.step for r in rows] == [
        "slurm_drain", "k8s_cordon", "k8s_evict", "collect_evidence", "vm_restart", "verify", "validate", "return"]
    assert rows[3].outcome.startswith(f"collected from {NODE}: nvidia-smi-q ") and "journal line written" in \
        rows[3].outcome
    assert [c.purpose for c in jobs.started] == ["collect evidence", "validate"]
    assert (tools / "journal").read_text().splitlines() == [
        f'remediation {rem.id}: cause "{rem.cause}": action move-host']
    assert [(n, st) for _, n, st in items_of(sessions, rem.id)] == [
        ("nvidia-smi-q", "collected"), ("remapped-rows", "collected"), ("kernel-log", "collected")]


def test_before_a_quarantine_the_state_is_kept_again_only_after_a_machine_action(sessions, world, clock,
                                                                                   tools) -> None:
    # A ladder of one machine action then quarantine (the shipped one for xid 79 moves the host first).
    settings = settings_with(policy={"faults": {"ladders": {"gpu-hardware": ["restart", "quarantine"]}}})
    jobs = LocalJobs()
    engine = engine_for(sessions, world, settings, clock, jobs)
    with world.mutate() as st:
        st["nodes"][NODE]["vm"]["broken"] = True  # the restart does not fix it: verify fails
    drive(engine, clock, publish(sessions, settings, clock, NODE, reason=GPU_OFF_THE_BUS, world=world), limit=2000)
    rem = rem_for(sessions, NODE)
    steps = [r.step for r in steps_of(sessions, rem.id)]
    assert rem.status == "quarantined"
    assert steps == ["slurm_drain", "k8s_cordon", "k8s_evict", "collect_evidence", "vm_restart", "verify",
                     "collect_evidence", "quarantine"]
    assert len({step for step, _, _ in items_of(sessions, rem.id)}) == 2  # two collections, three items each
    assert len((tools / "journal").read_text().splitlines()) == 1  # the line before the restart alone


def test_a_class_that_goes_straight_to_quarantine_has_its_state_kept_once(sessions, world, clock, tools) -> None:
    # A ladder with no machine rung (a site that sends xid 79 to the vendor at once).
    settings = settings_with(policy={"faults": {"ladders": {"gpu-hardware": ["quarantine"]}}})
    engine = engine_for(sessions, world, settings, clock, LocalJobs())
    drive(engine, clock, publish(sessions, settings, clock, NODE, reason=GPU_OFF_THE_BUS, world=world))
    rem = rem_for(sessions, NODE)
    assert rem.status == "quarantined"
    assert [r.step for r in steps_of(sessions, rem.id)][-2:] == ["collect_evidence", "quarantine"]
    assert not (tools / "journal").exists()  # nothing rebooted


def test_a_site_without_a_validation_records_why_and_takes_no_step(sessions, world, clock, tools) -> None:
    settings = settings_with(validation={"backend": "none"})
    engine = engine_for(sessions, world, settings, clock, None)
    drive(engine, clock, publish(sessions, settings, clock, NODE, reason=GPU_OFF_THE_BUS, world=world))
    rem = rem_for(sessions, NODE)
    assert "collect_evidence" not in [r.step for r in steps_of(sessions, rem.id)]
    assert rem.context["no_evidence"] == NO_JOBS
    assert not (tools / "calls").exists()


def test_a_silent_slurmd_is_said_and_the_ladder_goes_on(sessions, world, clock, tools) -> None:
    settings = settings_with()
    engine = engine_for(sessions, world, settings, clock, LocalJobs())
    follow = publish(sessions, settings, clock, NODE, reason=GPU_OFF_THE_BUS, world=world)
    with world.mutate() as st:
        st["nodes"][NODE]["slurm"]["flags"] = [*st["nodes"][NODE]["slurm"]["flags"], "NOT_RESPONDING"]
    drive(engine, clock, follow, limit=2000)
    rem = rem_for(sessions, NODE)
    row = next(r for r in steps_of(sessions, rem.id) if r.step == "collect_evidence")
    assert row.outcome == f"no evidence: slurmd on {NODE} is not responding, so no job can run there"
    assert row.detail["no_evidence"] == row.outcome and not (tools / "calls").exists()
    with sessions() as s:
        assert s.get(Remediation, rem.id).context["evidence_at"]


def test_other_classes_collect_nothing_but_the_journal_line(sessions, world, clock, tools) -> None:
    settings, jobs = settings_with(), LocalJobs()
    engine = engine_for(sessions, world, settings, clock, jobs)
    drive(engine, clock, publish(sessions, settings, clock, NODE, reason="node misbehaving", world=world))
    rem = rem_for(sessions, NODE)
    assert [c.purpose for c in jobs.started][0] == "collect evidence" and items_of(sessions, rem.id) == []
    assert (tools / "journal").read_text().strip().endswith(": action restart")
    assert not (tools / "calls").exists()  # no nvidia-smi: the class is not one the site chose
