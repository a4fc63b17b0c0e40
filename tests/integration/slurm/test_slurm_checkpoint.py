"""Checkpoint before the hammer, on the real slurmctld: a FAIL on a busy node asks its job to save
its work with ``scancel --signal=USR1 --batch``, once, before on_jobs_timeout.

The service's data path runs as in ``test_slurm_workflow`` (the real Slurm watcher, the Redis stream,
ingest into Postgres, the workflow engine with the real ``CliSlurm``), with the database's intents,
as a worker has them. The jobs are real batch scripts that trap USR1 and append a line to a log for
every USR1 they receive, so "signalled once" is counted by the job itself:

- a job that writes its checkpoint and exits: the remediation goes on when it leaves, long before
  drain_timeout_s;
- a job that ignores the request: on_jobs_timeout (cancel) comes checkpoint_wait_s after it;
- a dry run: the request is recorded as "would", and the job gets nothing. That "nothing" is read
  only after a barrier: a USR2 the test sends after the dry run's drain has recorded the request
  reaches the job's log, so a USR1 sent before it would be there too.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import redis
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from remediation.adapters.memory import MemoryKube, MemoryWorld
from remediation.adapters.noop import NoopKube, NoopMachine, NoopSlurm, Recorder
from remediation.adapters.slurm.args import InvalidSlurmArgument
from remediation.adapters.slurm.cli import CliSlurm
from remediation.clock import SystemClock
from remediation.db.intents import StepIntents
from remediation.db.models import AuditLog
from remediation.domain.checkpoint import CheckpointRequest
from remediation.domain.step_bodies import Adapters
from remediation.settings import Settings, load_settings
from tests.conftest import REDIS_URL
from tests.integration.slurm.conftest import SlurmCluster
from tests.integration.slurm.test_slurm_workflow import (
    FULL_RUN,
    Pipeline,
    SlurmdRestartVM,
    rems_of,
    steps_of,
    wait_idle,
)
from tests.pace import within

pytestmark = pytest.mark.slurm

NODE = "gpu-node-1"
DRAIN_TIMEOUT_S = 300  # never waited out here: each test ends far sooner

#: Saves a checkpoint (a file) on USR1 and exits; every USR1 or USR2 received is a line in the log.
CHECKPOINTS = """#!/bin/bash
trap 'echo "USR1 $(date +%s.%N)" >> {log}; echo saved > {checkpoint}; exit 0' USR1
trap 'echo "USR2 $(date +%s.%N)" >> {log}' USR2
echo ready >> {log}
while true; do sleep 1 & wait $!; done
"""
#: Notes USR1 and USR2 in the log and goes on working.
IGNORES = """#!/bin/bash
trap 'echo "USR1 $(date +%s.%N)" >> {log}' USR1
trap 'echo "USR2 $(date +%s.%N)" >> {log}' USR2
echo ready >> {log}
while true; do sleep 1 & wait $!; done
"""


@dataclass
class CheckpointPipeline(Pipeline):
    """The workflow test's pipeline with the database's intents (what a worker builds), or the
    dry-run twins over the real Slurm with a recorder."""

    recorder: Recorder | None = None

    @property
    def adapters(self) -> Adapters:
        intents = StepIntents(self.sessions)
        slurm = self.slurm_control
        if self.recorder is not None:
            return Adapters(
                NoopSlurm(slurm, self.recorder),
                NoopKube(MemoryKube(self.world), self.recorder),
                NoopMachine(self.recorder),
                intents=intents,
            )
        return Adapters(slurm, MemoryKube(self.world), self.vm, intents=intents)


@dataclass
class Job:
    id: str
    log: Path
    checkpoint: Path

    def lines(self, word: str) -> list[str]:
        return (
            [line for line in self.log.read_text().splitlines() if line.startswith(word)]
            if self.log.exists()
            else []
        )


@pytest.fixture
def checkpoint_pipeline(
    slurm: SlurmCluster, redis_client: redis.Redis, redis_prefix: str, sessions: sessionmaker[Session]
) -> Iterator[Callable[..., CheckpointPipeline]]:
    made: list[SlurmdRestartVM] = []
    pipelines: list[CheckpointPipeline] = []

    def make(dry_run: bool = False, **workflow: Any) -> CheckpointPipeline:
        world = MemoryWorld(nodes=slurm.nodes)
        made.append(SlurmdRestartVM(world, slurm))
        settings = settings_for(slurm, redis_prefix, dry_run, **workflow)
        pipelines.append(CheckpointPipeline(
            slurm, settings, redis_client, sessions, world, made[-1], recorder=Recorder() if dry_run else None
        ))
        return pipelines[-1]

    yield make
    for provider in made:
        provider.close()
    for pipeline in pipelines:
        pipeline.close()


def settings_for(cluster: SlurmCluster, prefix: str, dry_run: bool, **workflow: Any) -> Settings:
    return load_settings(
        dry_run=dry_run,
        broker={"redis_url": REDIS_URL, "key_prefix": prefix, "ingest_claim_idle_s": 1},
        slurm=cluster.slurm_options(poll_interval_s=0.2),
        policy={"min_restart_gap_s": 0, "breaker_max_fraction": 1.0},
        workflow={
            "poll_interval_s": 0.3,
            "max_wait_s": 1.0,
            "drain_timeout_s": DRAIN_TIMEOUT_S,
            "verify_timeout_s": 60,
            "lease_s": 30,
            "sweep_interval_s": 0.5,
            "checkpoint_signal": "USR1",
            **workflow,
        },
    )


def submit(cluster: SlurmCluster, script: str, tmp_name: str, *options: str) -> Job:
    """Run ``script`` as a batch job on NODE (with sbatch ``options``) and wait until it has set its traps."""
    work = cluster.workdir / tmp_name
    work.mkdir()
    job_log, checkpoint = work / "signals.log", work / "checkpoint"
    path = work / "job.sh"
    path.write_text(script.format(log=job_log, checkpoint=checkpoint))
    out = cluster.run("sbatch", "--parsable", "-w", NODE, "-o", "/dev/null", "-D", str(work), *options, str(path))
    job = Job(out.stdout.strip().split(";")[0], job_log, checkpoint)
    deadline = within(20)
    while not job.lines("ready"):
        assert time.monotonic() < deadline, f"job {job.id} never started"
        time.sleep(0.1)
    return job


def job_state(cluster: SlurmCluster, job: str) -> str:
    out = cluster.run("scontrol", "show", "job", "-o", job, check=False).stdout
    return next((w.split("=", 1)[1] for w in out.split() if w.startswith("JobState=")), "GONE")


def audits(sessions: sessionmaker[Session], action: str) -> list[AuditLog]:
    with sessions() as s:
        return list(s.scalars(select(AuditLog).where(AuditLog.action == action).order_by(AuditLog.id)))


def fail(p: CheckpointPipeline) -> datetime:
    """The researcher's FAIL on the busy node; returns when it was set."""
    at = SystemClock().now()
    p.cluster.scontrol("update", f"nodename={NODE}", "state=fail", "reason=loss went NaN after a hang")
    return at


def test_a_job_that_checkpoints_on_usr1_is_signalled_once_and_the_remediation_goes_on(
    slurm: SlurmCluster, checkpoint_pipeline: Callable[..., CheckpointPipeline]
) -> None:
    p = checkpoint_pipeline(checkpoint_wait_s=120)
    job = submit(slurm, CHECKPOINTS, "saves")
    with p.watching():
        failed = fail(p)
        p.wait_event(NODE, 5.0)
        (f,) = p.take_opened()
        p.settle([f], timeout=90)
        (rem,) = rems_of(p.sessions, NODE)
        assert rem.status == "succeeded"
        rows = steps_of(p.sessions, rem.id)
        assert [r.step for r in rows] == FULL_RUN
        drain = rows[0]
        request = CheckpointRequest.load(drain.provider_op)
        assert request is not None and request.jobs == (job.id,) and request.signal == "USR1" and request.sent
        # The job saved its work on the one USR1 it got, and left; the drain went on at once.
        assert len(job.lines("USR1")) == 1 and job.checkpoint.read_text() == "saved\n"
        assert drain.outcome == "drained; no jobs running"
        assert drain.finished_at is not None
        drained_after = (drain.finished_at - failed).total_seconds()
        assert drained_after < 30, f"drain took {drained_after:.1f}s (drain_timeout_s is {DRAIN_TIMEOUT_S})"
        (audit,) = audits(p.sessions, "checkpoint_requested")
        assert audit.detail["jobs"] == [job.id] and audit.detail["signal"] == "USR1" and audit.target == NODE
        assert not audits(p.sessions, "jobs_cancelled") and not audits(p.sessions, "jobs_timeout")
        wait_idle(slurm, NODE)
    assert job_state(slurm, job.id) in ("COMPLETED", "GONE")


def test_a_job_that_ignores_the_request_is_cancelled_checkpoint_wait_s_after_it(
    slurm: SlurmCluster, checkpoint_pipeline: Callable[..., CheckpointPipeline]
) -> None:
    p = checkpoint_pipeline(checkpoint_wait_s=4, on_jobs_timeout="cancel")
    job = submit(slurm, IGNORES, "ignores")
    with p.watching():
        fail(p)
        p.wait_event(NODE, 5.0)
        (f,) = p.take_opened()
        p.settle([f], timeout=90)
        (rem,) = rems_of(p.sessions, NODE)
        assert rem.status == "succeeded"
        drain = steps_of(p.sessions, rem.id)[0]
        request = CheckpointRequest.load(drain.provider_op)
        assert request is not None
        (cancel,) = audits(p.sessions, "jobs_cancelled")
        assert cancel.detail["jobs"] == [job.id] and "4s after the checkpoint request (USR1)" in cancel.reason
        waited = (cancel.at - request.at).total_seconds()
        assert 4 <= waited < 15, (
            f"cancelled {waited:.1f}s after the request (checkpoint_wait_s 4, drain_timeout_s 300)"
        )
        assert len(job.lines("USR1")) == 1  # asked once, however many looks the drain took
        assert job_state(slurm, job.id) in ("CANCELLED", "GONE")
        wait_idle(slurm, NODE)


def test_a_dry_run_records_would_signal_and_the_job_gets_nothing(
    slurm: SlurmCluster, checkpoint_pipeline: Callable[..., CheckpointPipeline]
) -> None:
    p = checkpoint_pipeline(dry_run=True)
    job = submit(slurm, IGNORES, "dry")
    assert p.recorder is not None
    with p.watching():
        fail(p)
        p.wait_event(NODE, 5.0)
        (f,) = p.take_opened()
        for _ in range(3):
            nxt = p.engine.run(f.remediation_id, f.step)
            assert nxt is not None and nxt.step == "slurm_drain"
            f = nxt
    (entry,) = [a for a in p.recorder.actions if a["would"] == "signal jobs"]
    assert entry["jobs"] == [job.id] and entry["signal"] == "USR1"
    (audit,) = audits(p.sessions, "checkpoint_requested")
    assert audit.dry_run and audit.reason.startswith("would")
    (rem,) = rems_of(p.sessions, NODE)
    assert rem.dry_run and (rem.wait_reason or "").startswith("would")
    # The barrier: a USR2 sent now reaches the job's log; a USR1 sent before it would be there too.
    slurm.run("scancel", "--signal=USR2", "--batch", job.id)
    deadline = within(20)
    while not job.lines("USR2"):
        assert time.monotonic() < deadline, "the job never logged the barrier's USR2"
        time.sleep(0.1)
    assert job.lines("USR1") == [] and job_state(slurm, job.id) == "RUNNING"


@pytest.mark.parametrize("scope", ["batch", "full"])
def test_signal_jobs_reaches_the_job_and_a_job_that_has_left_is_no_error(
    slurm: SlurmCluster, scope: str
) -> None:
    """``scancel --signal=USR1 --batch|--full`` through CliSlurm, one argv per job: the batch script
    traps it (with --full the job's step gets it too); an ended job is what we wanted anyway; a
    malformed id or a signal outside the catchable set never reaches Slurm."""
    cli = CliSlurm(slurm.settings())
    job = submit(slurm, IGNORES, f"direct-{scope}")
    cli.signal_jobs([job.id], "USR1", scope)  # type: ignore[arg-type]
    deadline = within(20)
    while not job.lines("USR1"):
        assert time.monotonic() < deadline, "the job never logged the USR1"
        time.sleep(0.1)
    assert len(job.lines("USR1")) == 1 and job_state(slurm, job.id) == "RUNNING"
    slurm.run("scancel", job.id)
    deadline = within(20)
    while job_state(slurm, job.id) not in ("CANCELLED", "COMPLETED", "GONE"):
        assert time.monotonic() < deadline
        time.sleep(0.2)
    cli.signal_jobs([job.id], "USR1", scope)  # type: ignore[arg-type]  # ended: not an error
    with pytest.raises(InvalidSlurmArgument):
        cli.signal_jobs(["1; scancel -u root"], "USR1", scope)  # type: ignore[arg-type]
    with pytest.raises(InvalidSlurmArgument):
        cli.signal_jobs([job.id], "KILL", scope)  # type: ignore[arg-type]


def test_a_signal_slurm_refused_is_sent_on_the_retry_and_none_twice(
    slurm: SlurmCluster, sessions: sessionmaker[Session]
) -> None:
    """Three jobs on the node; slurmctld refuses the second one's USR1 once (``Resource temporarily
    unavailable``, a transient error), so the drain's first run ends after signalling only the first.
    The retry signals the second and the third, and the first is not signalled again: each job logs
    exactly one USR1."""
    import shutil

    from remediation.clock import FakeClock
    from remediation.db.models import Node, Remediation, RemediationStep
    from remediation.services.retries import RetryLater
    from remediation.services.workflow import Workflow

    # Each job asks for little memory, or the first one's default (the whole node) keeps the others out.
    jobs = [submit(slurm, IGNORES, f"partial-{i}-{time.monotonic_ns()}", "--mem=1G") for i in range(3)]
    real = str(slurm.slurm_options().get("scancel") or shutil.which("scancel"))
    refuse = slurm.workdir / f"scancel-refuses-once-{time.monotonic_ns()}"
    refuse.write_text(
        "#!/bin/sh\n"
        f'case "$*" in *" {jobs[1].id}") if [ ! -e "$0.done" ]; then : > "$0.done"\n'
        f'  echo "scancel: error: Kill job error on job id {jobs[1].id}: Resource temporarily unavailable" >&2\n'
        "  exit 1; fi;; esac\n"
        f'exec {real} "$@"\n'
    )
    refuse.chmod(0o755)
    settings = load_settings(
        slurm=slurm.slurm_options(scancel=str(refuse)),
        workflow={"poll_interval_s": 1, "max_wait_s": 1.0, "drain_timeout_s": DRAIN_TIMEOUT_S, "lease_s": 30,
                  "checkpoint_signal": "USR1", "checkpoint_wait_s": 120},
    )
    clock = FakeClock(SystemClock().now())
    world = MemoryWorld(nodes=slurm.nodes)
    engine = Workflow(sessions, Adapters(CliSlurm(settings.slurm), MemoryKube(world), None,
                                         intents=StepIntents(sessions)), settings, clock=clock)
    slurm.scontrol("update", f"nodename={NODE}", "state=fail", "reason=loss went NaN after a hang")
    now = clock.now()
    with sessions() as s, s.begin():
        s.add(Node(name=NODE, status="remediating", first_seen_at=now, updated_at=now))
        rem = Remediation(node=NODE, cause="loss went NaN after a hang", source="slurm", status="running",
                          step="slurm_drain", ladder=0, opened_at=now, updated_at=now, next_run_at=now, context={})
        s.add(rem)
        s.flush()
        rid = rem.id
    refused = None
    for _ in range(5):  # the first look drains; a look at the draining node asks its jobs
        try:
            engine.run(rid, "slurm_drain")
        except RetryLater as exc:
            refused = exc
            break
        clock.advance(2)
    assert refused is not None and "Resource temporarily unavailable" in str(refused)
    clock.advance(120)  # past the retry's backoff
    engine.run(rid, "slurm_drain")
    for j in jobs:
        deadline = within(20)
        while not j.lines("USR1"):
            assert time.monotonic() < deadline, f"job {j.id} never got its USR1"
            time.sleep(0.1)
    with sessions() as s:
        row = s.scalars(select(RemediationStep).where(RemediationStep.remediation_id == rid)).one()
        request = CheckpointRequest.load(row.provider_op)
    assert request is not None and request.signalled == tuple(j.id for j in jobs) and request.sent
    engine.run(rid, "slurm_drain")  # a later look sends nothing
    assert [len(j.lines("USR1")) for j in jobs] == [1, 1, 1]
