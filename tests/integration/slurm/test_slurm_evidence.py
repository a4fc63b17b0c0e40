"""Collected evidence on the real slurmctld (22.05 and 26.05): the node's state kept before its reboot.

A check-job environment the test provides (sbatch passes the worker's PATH on) stands in for the GPU
tools: an ``nvidia-smi`` whose ``-q`` prints a report naming the GPU, a ``journalctl`` that prints the
kernel's Xid line, and a ``logger`` that appends to a file the test reads as the node's journal. Each
records the arguments it got. Nothing stands in for Slurm: the evidence job runs in the maintenance
reservation through ``scontrol`` and ``sbatch``, and the worker is the service's own engine.

- a FAIL "xid 79" node is drained, gets one evidence job, then its machine action (xid 79's first rung
  moves the host), then its GPU check, and
  returns; ``remediation remediations show`` holds the ``nvidia-smi -q`` output and the kernel line,
  and the node's journal holds the one line that says why it was rebooted;
- a worker SIGKILLed right after it submitted the evidence job: the worker that resumes the step finds
  that job and submits none, so the node's state is collected once.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import redis
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session, sessionmaker

from remediation.adapters.memory import MemoryVM, MemoryWorld
from remediation.adapters.slurm.cli import CliSlurm
from remediation.adapters.slurm.validator import SlurmValidator
from remediation.clock import SystemClock, aware
from remediation.db.models import EvidenceItem, Node, Remediation, RemediationStep
from remediation.domain.step_bodies import Adapters
from remediation.domain.stepdetail import JobNonce
from remediation.services.workflow import Workflow
from remediation.settings import Settings, load_settings
from tests.integration.slurm.conftest import SlurmCluster
from tests.integration.slurm.test_slurm_validation import drive, reservations, status
from tests.integration.slurm.test_slurm_workflow import (
    Pipeline,
    SlurmdRestartVM,
    rems_of,
    steps_of,
    wait_idle,
)
from tests.integration.workerproc import wait_for

pytestmark = pytest.mark.slurm
#: The releases this module runs on (tests/integration/slurm/conftest.py): the oldest and the newest.
SLURM_RELEASES = ("22.05", "26.05")
ROOT = Path(__file__).resolve().parents[3]
PREFIX = "remediation:"
#: The stand-ins. Each appends its arguments to ``calls`` beside it.
SMI = """#!/bin/sh
echo "nvidia-smi $*" >> "$(dirname "$0")/calls"
case "$1" in
  -q) printf '==============NVSMI LOG==============\\nGPU 00000000:3B:00.0\\n    Serial Number : 1652022044212\\n' ;;
  --query-remapped-rows=*) printf 'gpu_bus_id, remapped_rows.uncorrectable\\n00000000:3B:00.0, 1\\n' ;;
esac
"""
JOURNALCTL = """#!/bin/sh
echo "journalctl $*" >> "$(dirname "$0")/calls"
echo "kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus."
"""
LOGGER = """#!/bin/sh
echo "logger $*" >> "$(dirname "$0")/calls"
shift 3
echo "$*" >> "$(dirname "$0")/journal"
"""


@pytest.fixture
def tools(slurm: SlurmCluster, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A directory slurmd and the test both see, first on the PATH the worker (and so every job it
    submits) has."""
    path = slurm.workdir / f"tools-{time.monotonic_ns()}"
    path.mkdir()
    for name, text in (("nvidia-smi", SMI), ("journalctl", JOURNALCTL), ("logger", LOGGER)):
        (path / name).write_text(text)
        (path / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{path}:{slurm.env['PATH']}")
    yield path
    slurm.cancel_jobs()
    for line in reservations(slurm).splitlines():
        if line.startswith("ReservationName="):
            slurm.scontrol("delete", line.split()[0], check=False)


@pytest.fixture
def committed(db: Engine) -> sessionmaker[Session]:
    """Sessions on the test's own database, whose commits the CLI and a worker process see."""
    return sessionmaker(bind=db, expire_on_commit=False)


def settings_for(cluster: SlurmCluster, tools: Path, prefix: str, **over: Any) -> Settings:
    """The shipped policy, with this cluster's Slurm and a Slurm validation (the evidence job needs one);
    ``evidence`` as shipped."""
    return load_settings(
        broker={"redis_url": os.environ.get("REMEDIATION_TEST_REDIS", "redis://127.0.0.1:6379/0"),
                "key_prefix": prefix, "ingest_claim_idle_s": 1},
        slurm=cluster.slurm_options(poll_interval_s=0.2),
        policy={"min_restart_gap_s": 0, "breaker_max_fraction": 1.0},
        workflow={"poll_interval_s": 0.3, "max_wait_s": 1.0, "drain_timeout_s": 120, "verify_timeout_s": 60,
                  "lease_s": 30, "sweep_interval_s": 0.5, **over.pop("workflow", {})},
        validation={"backend": "slurm", "slurm_workdir": str(tools / "gate"), "poll_interval_s": 0.2,
                    "checks": {"unknown": ["/bin/true"], "gpu-hardware": ["/bin/true"]}},
        **over,
    )


def calls(tools: Path) -> list[str]:
    path = tools / "calls"
    return path.read_text().splitlines() if path.exists() else []


def evidence_jobs(cluster: SlurmCluster, name: str) -> list[str]:
    out = cluster.run("squeue", "-h", f"--name={name}", "-t", "all", "-o", "%i").stdout
    return [line.strip() for line in out.splitlines() if line.strip()]


def cli(settings_env: dict[str, str], *args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "remediation.cli", *args], env=settings_env,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_failed_xid79_node_gets_its_evidence_job_before_its_reboot(
        slurm: SlurmCluster, tools: Path, redis_client: redis.Redis, redis_prefix: str,
        committed: sessionmaker[Session], pg_url: str) -> None:
    sessions = committed
    node = slurm.nodes[1]
    cfg = settings_for(slurm, tools, redis_prefix)
    world = MemoryWorld(nodes=slurm.nodes)
    vm = SlurmdRestartVM(world, slurm)
    p = Pipeline(slurm, cfg, redis_client, sessions, world, vm, validator=SlurmValidator(cfg.slurm, cfg.validation))
    try:
        with p.watching():
            slurm.scontrol("update", f"nodename={node}", "state=fail", "reason=xid 79")
            p.wait_event(node, 5.0)
            (first,) = p.take_opened()
            p.settle([first], timeout=120)
    finally:
        vm.close()
        p.close()
    (rem,) = rems_of(sessions, node)
    rows = steps_of(sessions, rem.id)
    assert rem.status == "succeeded", [(r.step, r.outcome, r.error) for r in rows]
    assert [r.step for r in rows] == ["slurm_drain", "k8s_cordon", "k8s_evict", "collect_evidence", "vm_restart",
                                      "verify", "validate", "return"]
    collected, restart = rows[3], rows[4]
    assert collected.finished_at <= restart.started_at  # the state was kept before the reboot began
    assert [n for n, _ in vm.revived] == [node]
    job = collected.provider_op["name"]
    assert evidence_jobs(slurm, job) == [str(collected.provider_op["job_id"])]  # one job
    assert job not in reservations(slurm)  # its reservation is gone
    ran = calls(tools)
    assert ran.count("nvidia-smi -q") == 1 and sum(c.startswith("journalctl -k") for c in ran) == 1
    assert (tools / "journal").read_text().splitlines() == [
        f'remediation {rem.id}: cause "{rem.cause}": action move-host']  # xid 79's first rung
    with sessions() as s:
        items = {i.name: i for i in s.scalars(select(EvidenceItem).where(EvidenceItem.remediation_id == rem.id))}
    assert sorted(items) == ["kernel-log", "nvidia-smi-q", "remapped-rows"]
    assert {i.status for i in items.values()} == {"collected"}
    env = {**os.environ, "REMEDIATION_DATABASE__URL": pg_url, "PYTHONPATH": str(ROOT)}
    shown = cli(env, "remediations", "show", str(rem.id))
    assert "NVSMI LOG" in shown and "Serial Number : 1652022044212" in shown
    assert "Xid (PCI:0000:3b:00): 79" in shown
    wait_idle(slurm, node)


def open_at_evidence(sessions: sessionmaker[Session], node: str) -> int:
    """A remediation of an xid 79 node at its evidence step, drained by us (as slurm_drain leaves it)."""
    now = datetime.now(UTC)
    with sessions() as s, s.begin():
        if s.get(Node, ("default", node)) is None:
            s.add(Node(name=node, status="remediating", first_seen_at=now, updated_at=now))
        rem = Remediation(node=node, cause="slurm FAIL: xid 79", source="slurm", status="running",
                          step="collect_evidence", ladder=0, opened_at=now, updated_at=now, next_run_at=now,
                          fault_class="gpu-hardware", action="restart",
                          context={"fault_class": "gpu-hardware", "event_state": "FAIL",
                                   "provider_id": f"memory:///{node}", "observed_at": now.isoformat()})
        s.add(rem)
        s.flush()
        return rem.id


def lease_over(sessions: sessionmaker[Session], rid: int) -> bool:
    with sessions() as s:
        rem = s.get(Remediation, rid)
        return rem is not None and rem.lease_until is not None and aware(rem.lease_until) < datetime.now(UTC)


def test_a_worker_killed_during_collection_does_not_collect_twice(
        slurm: SlurmCluster, tools: Path, committed: sessionmaker[Session], pg_url: str,
        redis_prefix: str) -> None:
    sessions = committed
    node = slurm.nodes[2]
    cfg = settings_for(slurm, tools, redis_prefix, workflow={"lease_s": 2})
    slurm.scontrol("update", f"nodename={node}", "state=drain", f'reason="{PREFIX} slurm FAIL: xid 79"')
    rid = open_at_evidence(sessions, node)
    job = {"db": pg_url, "rid": rid, "node": node, "slurm": cfg.slurm.model_dump(mode="json"),
           "validation": cfg.validation.model_dump(mode="json"), "workflow": cfg.workflow.model_dump(mode="json")}
    with subprocess.Popen([sys.executable, "-m", "tests.integration.slurm.killed_collector", json.dumps(job)],
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as worker:
        try:
            line = worker.stdout.readline() if worker.stdout else ""
            assert line.startswith("SUBMITTED "), worker.communicate(timeout=10)
            os.kill(worker.pid, signal.SIGKILL)  # after sbatch, before the step recorded the job
        finally:
            worker.kill()
            worker.wait(10)
    submitted = line.split()[1]
    with sessions() as s:
        row = s.scalars(select(RemediationStep).where(RemediationStep.remediation_id == rid)).one()
        assert row.provider_op is None and JobNonce.load(row.detail).value  # nothing recorded but the nonce
    wait_for(lambda: lease_over(sessions, rid), 10, "the killed worker's lease to run out")
    world = MemoryWorld(nodes=slurm.nodes)
    engine = Workflow(sessions, Adapters(CliSlurm(cfg.slurm), None, MemoryVM(world),
                                         SlurmValidator(cfg.slurm, cfg.validation)), cfg, clock=SystemClock())
    drive(engine, rid, "collect_evidence", lambda: status(sessions, rid)[1] != "collect_evidence", timeout=60)
    with sessions() as s:
        row = s.scalars(select(RemediationStep).where(RemediationStep.remediation_id == rid)).one()
        items = s.scalars(select(EvidenceItem).where(EvidenceItem.remediation_id == rid)).all()
    assert row.status == "done" and str(row.provider_op["job_id"]) == submitted, row.outcome
    assert evidence_jobs(slurm, row.provider_op["name"]) == [submitted]  # the killed worker's job, alone
    assert calls(tools).count("nvidia-smi -q") == 1
    assert sorted(i.name for i in items) == ["kernel-log", "nvidia-smi-q", "remapped-rows"]
