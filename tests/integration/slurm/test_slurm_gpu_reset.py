"""The gpu-reset rung on the real slurmctld (22.05): one reset job per key, proof by its exit code.

A stand-in ``nvidia-smi`` that the test puts on the job's PATH (sbatch passes the submitting worker's
environment on) records every call it gets in a file and answers the index/bus-id query the way the real
one does; its ``-r`` exits with the code the test writes. Nothing stands in for Slurm: the validator runs
the real ``scontrol create reservation``, ``sbatch``, ``squeue`` and ``scontrol show job``. The machine
is the in-memory VM world, so a reboot would show in its calls.

- an Xid 46 node with the GPU's PCI address: exactly one reset job (a step started a second time
  with the same key, as by a redelivered task, finds it by name), ``-pm 0`` and ``-r`` for the GPU at
  that address only, verify without a reboot, the GPU check passes, the node returns, and no reboot;
- a reset that fails climbs to the next rung (the restart) within the same remediation.

Only on 22.05: the job runs through the validator whose reservation and job handling
``test_slurm_validation`` proves on both releases, so a second release would add time, not coverage.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from remediation.adapters.memory import MemoryKube, MemoryVM, MemoryWorld
from remediation.adapters.slurm.cli import CliSlurm
from remediation.adapters.slurm.validator import SlurmValidator
from remediation.clock import SystemClock
from remediation.db.models import Node, Remediation, RemediationStep
from remediation.domain.step_bodies import Adapters
from remediation.domain.stepdetail import JobNonce
from remediation.services.workflow import Workflow
from remediation.settings import Settings, load_settings
from remediation.validation.port import ValidationCheck
from tests.integration.slurm.conftest import SlurmCluster
from tests.integration.slurm.test_slurm_validation import drive, reservations, status

pytestmark = pytest.mark.slurm
#: The releases this module runs on (tests/integration/slurm/conftest.py): see the docstring.
SLURM_RELEASES = ("22.05",)

PREFIX = "remediation:"
SMI = """#!/bin/sh
echo "$*" >> "$(dirname "$0")/argv"
case "$1" in
  --query-gpu=index,pci.bus_id) printf '0, 00000000:1B:00.0\\n1, 00000000:3B:00.0\\n' ;;
  -r) exit "$(cat "$(dirname "$0")/reset-exit" 2>/dev/null || echo 0)" ;;
esac
"""


@pytest.fixture
def smi(slurm: SlurmCluster, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A directory slurmd and the test both see, holding the stand-in nvidia-smi, first on the PATH the
    worker (and so every job it submits) has."""
    path = slurm.workdir / f"smi-{time.monotonic_ns()}"
    path.mkdir()
    (path / "nvidia-smi").write_text(SMI)
    (path / "nvidia-smi").chmod(0o755)
    monkeypatch.setenv("PATH", f"{path}:{slurm.env['PATH']}")
    yield path
    # A job a failed assertion left behind must not hold its reservation (or the node) for the next test.
    slurm.cancel_jobs()
    for line in reservations(slurm).splitlines():
        if line.startswith("ReservationName="):
            slurm.scontrol("delete", line.split()[0], check=False)


def settings_for(cluster: SlurmCluster, workdir: Path) -> Settings:
    return load_settings(
        slurm=cluster.slurm_options(),
        workflow={"poll_interval_s": 0.2, "max_wait_s": 1.0, "lease_s": 30},
        policy={"min_restart_gap_s": 0, "faults": {"classify": True}},
        validation={"backend": "slurm", "slurm_workdir": str(workdir / "gate"), "poll_interval_s": 0.2,
                    "checks": {"unknown": ["/bin/true"], "gpu-transient": ["/bin/true"]}},
    )


def open_at_vm_restart(sessions: sessionmaker[Session], node: str) -> int:
    now = datetime.now(UTC)
    with sessions() as s, s.begin():
        if s.get(Node, ("default", node)) is None:
            s.add(Node(name=node, status="remediating", first_seen_at=now, updated_at=now))
        rem = Remediation(node=node, cause="NVRM: Xid (PCI:0000:3b:00): 46", source="slurm", status="running",
                          step="vm_restart", ladder=0, opened_at=now, updated_at=now, next_run_at=now,
                          fault_class="gpu-transient", action="gpu-reset",
                          context={"fault_class": "gpu-transient", "gpu_pci": "0000:3b:00", "event_state": "FAIL",
                                   "provider_id": f"memory:///{node}"})
        s.add(rem)
        s.flush()
        return rem.id


def engine_for(cfg: Settings, sessions: sessionmaker[Session], cluster: SlurmCluster) -> tuple[Workflow, MemoryWorld]:
    world = MemoryWorld(nodes=list(cluster.nodes))
    adapters = Adapters(CliSlurm(cfg.slurm), MemoryKube(world), MemoryVM(world), SlurmValidator(cfg.slurm, cfg.validation))
    return Workflow(sessions, adapters, cfg, clock=SystemClock()), world


def reset_jobs(cluster: SlurmCluster, name: str) -> list[str]:
    out = cluster.run("squeue", "-h", f"--name={name}", "-t", "all", "-o", "%i").stdout
    return [line.strip() for line in out.splitlines() if line.strip()]


def test_one_reset_job_resets_the_named_gpu_and_no_reboot_follows_a_passing_check(
        slurm: SlurmCluster, smi: Path, sessions: sessionmaker[Session]) -> None:
    node = slurm.nodes[1]
    cfg = settings_for(slurm, smi)
    slurm.scontrol("update", f"nodename={node}", "state=drain", f'reason="{PREFIX} xid 46"')
    rid = open_at_vm_restart(sessions, node)
    engine, world = engine_for(cfg, sessions, slurm)
    follow = engine.run(rid, "vm_restart")  # submits the reset job and records it before waiting
    assert follow is not None and follow.step == "vm_restart"
    with sessions() as s:
        row = s.scalars(select(RemediationStep).where(RemediationStep.remediation_id == rid)).one()
        op, nonce = dict(row.provider_op), JobNonce.load(row.detail).value
    assert nonce and op["name"] == f"nr-reset-r{rid}-a1-{nonce}" and op["job_id"]  # the nonce the row recorded
    # A worker killed after sbatch, before recording: the step starts again with the same key.
    again = SlurmValidator(cfg.slurm, cfg.validation).start(
        ValidationCheck(node, op["name"], tuple(op["command"]), op["timeout_s"]))
    assert again["job_id"] == op["job_id"]
    drive(engine, rid, "vm_restart", lambda: status(sessions, rid)[0] == "succeeded")
    assert status(sessions, rid) == ("succeeded", "done", 0)
    assert reset_jobs(slurm, op["name"]) == [op["job_id"]]  # exactly one reset job for the key
    assert (smi / "argv").read_text().splitlines() == [
        "--query-gpu=index,pci.bus_id --format=csv,noheader", "-pm 0 -i 1", "-r -i 1"]
    assert [c for c in world.calls() if c["op"].startswith("vm.")] == []  # no reboot
    with sessions() as s:
        rows = {r.step: r for r in s.scalars(select(RemediationStep).where(RemediationStep.remediation_id == rid))}
    assert rows["vm_restart"].detail["gpu_reset"]["exit_code"] == 0 and "nothing rebooted" in rows["verify"].outcome
    assert rows["validate"].status == "done" and op["name"] not in reservations(slurm)


def test_a_failing_reset_climbs_to_the_next_rung(slurm: SlurmCluster, smi: Path,
                                                 sessions: sessionmaker[Session]) -> None:
    node = slurm.nodes[2]
    (smi / "reset-exit").write_text("3")
    cfg = settings_for(slurm, smi)
    slurm.scontrol("update", f"nodename={node}", "state=drain", f'reason="{PREFIX} xid 46"')
    rid = open_at_vm_restart(sessions, node)
    engine, world = engine_for(cfg, sessions, slurm)
    drive(engine, rid, "vm_restart", lambda: status(sessions, rid)[2] == 1)
    assert status(sessions, rid)[1:] == ("vm_restart", 1)  # same remediation, the restart's rung
    with sessions() as s:
        row = s.scalars(select(RemediationStep).where(RemediationStep.remediation_id == rid)).one()
        assert row.status == "failed" and "the reset failed" in (row.error or "")
        assert row.detail["gpu_reset"]["exit_code"] == 3
        assert s.get(Remediation, rid).action == "restart"  # type: ignore[union-attr]
    _, flags, reason = slurm.nodes_now()[node]
    assert "DRAIN" in flags and reason == f"{PREFIX} xid 46"  # put back out of service, ours
    assert "nr-reset" not in reservations(slurm)
    assert [c for c in world.calls() if c["op"].startswith("vm.")] == []  # the restart is the next step's
